"""The per-commit timing verdict once the run-to-run noise is known: one run against the
runs before it, every case of every candidate at once.

A commit's gate compares dozens of cases. Judged one by one, each against a bar of a few
spreads of *one* run's median, a long history turned most commits that changed nothing
red (3-4% of no-op comparisons flagged, two-sided; at 16 timed cases a candidate, most
no-op commits). What is done instead, for each (candidate, pass, case) whose run-to-run
spread the history knows (`harness.records.noise`):

1. **The difference of runs.** The case's change is d = ln(new median) - mean of the ln
   medians of its baseline window: the last `WINDOW` runs of the history at the
   baseline's source hash (the same code), on the new run's chip where that chip has
   them. A difference of one run and the mean of n has the spread s * sqrt(1 + 1/n) where
   s is one run's (the standard error of a difference of means); the old bar forgot the
   first term's partner and flagged 2.1-sigma changes.
2. **A spread shrunk where its history is short.** s is the robust scale of the case's
   A/A pairs (1.4826 x their median |difference| / sqrt 2), worth about `MAD_EFFICIENCY`
   degrees of freedom per pair (the asymptotic efficiency of a median-absolute-deviation
   scale at the normal), combined with a prior spread s0 of `PRIOR_DF` degrees of
   freedom: s^2 = (PRIOR_DF s0^2 + nu s_hat^2) / (PRIOR_DF + nu), and the change is read
   against Student's t with PRIOR_DF + nu degrees of freedom, so the uncertainty of a
   spread estimated from two pairs is counted, not ignored. This is the moderated t of
   Smyth (2004), "Linear models and empirical Bayes methods for assessing differential
   expression in microarray experiments" (Stat. Appl. Genet. Mol. Biol. 3(1)), with the
   prior taken as the median spread of the candidate's other cases (else of every case
   of the GPU model) instead of fitted.
3. **The candidate as a whole.** A change to a kernel moves all its cases; the evidence
   pooled over them is where the power is. The candidate's change is the Hodges-Lehmann
   estimate (median of the Walsh averages) of its cases' d, robust to one case's outlier
   (with fewer than `ROBUST_CASES` cases, where that is their mean, the smallest d: every
   case must have moved, an intersection-union reading as in Berger (1982), "Multiparameter
   hypothesis testing and acceptance sampling", Technometrics 24(4); its A/A pairs are
   centred on their median, as the smallest of a few noisy changes lies below zero);
   its spread comes from the same statistic over the candidate's consecutive A/A runs in
   the history (so whatever a run's cases share, the chip's clock and power state, stays
   in it: on an H100 fa3_wgmma's cases moved 0.58% run to run and their mean 0.52%), moderated
   toward the median of the GPU model's other candidates (else the candidate's own case
   spread). One-sided (only a slowdown fails), Bonferroni over the owned candidates,
   weighted by where a step can begin: `CANDIDATE_ALPHA` is split over the candidates
   whose source hash the commit changed (or is unknown), and `UNCHANGED_SHARE` of it over
   the others (a weighted Bonferroni: the levels sum to at most 1.05 `CANDIDATE_ALPHA`).
   A commit changes one or two kernels; spending the level there is what lets a 2% slowdown
   of a kernel measured to 0.5% run to run be red at its own commit, while a slowdown of
   code that did not change (a driver, a runner) is left to the step search.
4. **The many cases of one run.** Per-case p-values (one-sided each way) go through the
   Benjamini-Hochberg procedure (Benjamini and Hochberg 1995, "Controlling the false
   discovery rate"; `scipy.stats.false_discovery_control`) over all the owned cases of
   the run, the yardsticks' apart: with no change at all this bounds the chance that any
   case is flagged by `CASE_Q`. A candidate found slower as a whole (3.) flags its cases
   that are slower by `MIN_CHANGE` at p < `PROTECTED_ALPHA` each (Fisher's protected
   test: the family's null is already rejected), at least its most significant one, so
   the gate's red names cases.

5. **Heavy tails.** Real run-to-run noise is not normal: in robust spreads, 4% of the
   committed per-case residuals of one chip's quiet series lie beyond 5 spreads (a cold
   first run, a power-capped turn), and a Student t fit gives 1.3 degrees of freedom
   (the mean of a run's cases: 3). So every p-value is read from Student's t with at
   most `CASE_TAIL_DF` (per case) or `CANDIDATE_TAIL_DF` (per candidate) degrees of
   freedom, whatever the spread's own: a 9-spread excursion of one case is then p = 0.02,
   not 3e-5, and one case alone needs a change far beyond its spread to be flagged at its
   commit; the step search (`harness.records.steps`) flags it once the next commit holds
   the new level. Except a change larger than any real excursion: beyond `LARGE_CHANGE`
   and `LARGE_K` spreads of the difference it is flagged whatever the count (the largest
   committed residual of one chip's runs is 1.7%, 15 spreads). Across chips (a run on
   another GPU than its baseline's) there is no such bound, and the candidate as a whole
   has the tails too: the chips of one model differ by several percent, so there both
   tests read `ACROSS_TAIL_DF`, and a small step is left to the step search.

6. **Confirmation runs.** A new run's entry may hold the medians of the same commit's
   confirmation runs (`confirm_ms`, harness.records.confirm: a suspect candidate timed
   again in fresh processes before the run was judged). Its change is then the mean of
   the ln medians of its `runs` runs against the window, with the spread
   s * sqrt(1/runs + 1/n) (`verdict_history.diff_scale`), per case and per candidate.
   The parent commit's code timed by the same run (`parent_ms`) takes the window's place
   (7.). A
   candidate of fewer than `ROBUST_CASES` cases confirmed by `CONFIRMED_MEAN_RUNS` runs
   or more against a baseline of its own chip is judged by the mean of its cases'
   changes, against the same mean over its A/A runs, instead of the least-moved case
   (3.): the intersection-union reading was there for one case's heavy-tailed excursion
   in one run, which a mean of several runs no longer has, and the least-moved of two
   cases gives up about half a spread of a real slowdown. Across chips the excursion is
   the chip's (a case 27-57% slower on one chip of a model), which more runs on that chip
   do not average: there the least-moved case stays.
7. **Two looks, and the parent on this runner.** A confirmed candidate is tested at
   `LOOK_SHARE` of its level: the gate looks once after the first round of confirmation
   runs and, where that left it undecided, once more after a second round
   (harness.records.confirm.extend); under no change the two looks reject with
   probability at most the sum of their levels (Bonferroni over the looks, the simplest
   of the group-sequential spending rules). A case whose parent's code the run timed on
   its own GPU (`MIN_RUNS` times a side, interleaved with the commit's own runs) is
   judged against those timings instead of the window: the same chip, the same minutes,
   so a chip's offset (across chips) and the runner's drift since the window's runs are
   on both sides; its spread the runs' own pooled (moderated toward the history's
   one-chip spread of the case where there is one, `PRIOR_DF` degrees of freedom), and
   its candidate by the two-sample test of harness.records.same_runner on the runs'
   levels (7 degrees of freedom after one round, 15 after two, where a candidate's
   A/A pairs in the history give a spread of a few: the few-case candidates of the
   0.5-1.5% band read 1.6-1.8% slower over 9 runs at p 0.04-0.06 per case against
   their window, and were not red).

A flag also needs the change to be at least `MIN_CHANGE` (1%). The budget of a run that
changed nothing: `CASE_Q` + `CANDIDATE_ALPHA` (0.5%), half the 1% a team can bear, the
other half left for the step search across commits and for the heavy tail of real
run-to-run noise. `bench/gate_verdicts.py` measures what a team's gate gives at each
commit of long series built from the committed records' residuals (docs/regressions.md).

Cases the history cannot judge (no A/A pair and no prior) keep the within-run rules of
`harness.records.compare`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from harness.records import same_runner
from harness.records.noise import Key, NoiseModel
from harness.records.same_runner import MIN_RUNS
from harness.records.verdict_flags import bar, flag
from harness.records.verdict_history import (  # noqa: F401  (names the tests and docs use)
    MAD_EFFICIENCY,
    MIN_COMMON,
    PRIOR_DF,
    ROBUST_CASES,
    WINDOW,
    Spread,
    candidate_change,
    candidate_pairs,
    case_spreads,
    centred,
    diff_scale,
    log_median,
    parent_logs,
    robust_scale,
    run_logs,
    walsh_median,
    window,
)
from harness.records.verdict_types import (  # noqa: F401  (names the tests and docs use)
    ACROSS_TAIL_DF,
    CANDIDATE_ALPHA,
    CANDIDATE_TAIL_DF,
    CASE_Q,
    CASE_TAIL_DF,
    CONFIRMED_MEAN_RUNS,
    LARGE_CHANGE,
    LARGE_K,
    LOOK_SHARE,
    MIN_CHANGE,
    OPEN_ALPHA,
    PROTECTED_ALPHA,
    UNCHANGED_SHARE,
    CandidateChange,
    CaseChange,
    RunDecision,
)

# ----------------------------------------------------------------- the decision


def decide(verdicts: Sequence[Any], new_entries: dict[Key, dict[str, Any]],
           base_entries: dict[Key, list[dict[str, Any]]], base_sources: dict[str, str],
           noise: NoiseModel, *, device: str,
           across_of: Callable[[Key], bool | None],
           yardstick: Callable[[str], bool],
           changed: Callable[[str], bool] = lambda _name: True) -> RunDecision:
    """Judge `verdicts` (harness.records.compare.Verdict, changed in place) by the module's
    rules where the history knows the noise: `new_entries` the new run's entries by key,
    `base_entries` the baseline's (newest first), `base_sources` the baseline's source
    hash per candidate, `device` the new run's GPU
    uuid, `across_of(key)` whether that comparison crosses chips, `yardstick(name)`
    whether a candidate never fails the gate, `changed(name)` whether the commit changed
    the candidate's source (module doc, 3.). Returns what was decided."""
    out = RunDecision()
    pools: dict[bool | None, dict[Key, list[float]]] = {}
    for v in verdicts:
        key = (v.variant, v.pass_name, v.case_id)
        entry = new_entries.get(key)
        xs = run_logs(entry or {})
        if entry is None or not xs or entry.get("status") != "passed":
            continue
        if not base_entries.get(key) or v.verdict in ("new", "missing"):
            continue  # not in the baseline: "new" names no base run to be judged against
        across = across_of(key)
        par = parent_logs(entry)  # the parent's code timed by this run, on this chip
        # The parent's code timed here, interleaved with the commit's own runs, is the
        # baseline: on the run's chip, in the same minutes (module doc, 7.).
        paired = min(len(par), len(xs)) >= MIN_RUNS
        if paired:
            win, kind = par, False
        else:
            base = [e for e in base_entries.get(key, []) if e.get("status") == "passed"]
            win = window(noise, key, base_sources.get(v.variant, ""),
                         device if not across else "", base)
            win, kind = (win + par if across is False else win), across
        if not win:
            continue
        pairs = pools.setdefault(kind, case_spreads(noise, kind))
        own = pairs.get(key, [])
        others = [robust_scale(p) for k, p in pairs.items()
                  if k[:2] == key[:2] and k != key and len(p) >= 2]
        pool = others or [robust_scale(p) for k, p in pairs.items() if len(p) >= 2]
        spread = Spread.moderate(own, statistics.median(pool) if pool else None)
        if paired:  # the runs' own spread, toward the history's where it has one
            spread = same_runner.pooled(xs, par, spread.value if spread else None)
        if spread is None:
            continue
        d = statistics.fmean(xs) - statistics.fmean(win)
        n, m = len(win), len(xs)
        out.cases[key] = CaseChange(key, d, n, spread, spread.p_up(d, n, CASE_TAIL_DF, m),
                                    spread.p_down(d, n, CASE_TAIL_DF, m), yardstick(v.variant),
                                    one_chip=kind is False, runs=m, logs=xs,
                                    parent=par if paired else [])
    _candidates(out, noise, across_of, changed)
    flag(out, verdicts)
    return out


def _candidates(out: RunDecision, noise: NoiseModel,
                across_of: Callable[[Key], bool | None],
                changed: Callable[[str], bool]) -> None:
    groups: dict[tuple[str, str], list[CaseChange]] = {}
    for c in out.cases.values():
        groups.setdefault(c.key[:2], []).append(c)
    mine = [g for g, cs in groups.items() if not cs[0].yardstick]
    n_changed = sum(1 for g in mine if changed(g[0]))
    n_same = len(mine) - n_changed
    theirs: dict[tuple[str, str], float] = {}
    kinds = {g: across_of(cs[0].key) for g, cs in groups.items()}
    for g in groups:
        pairs, _ = centred(candidate_pairs(noise, g[0], g[1], kinds[g]), len(groups[g]))
        if len(pairs) >= 2:
            theirs[g] = robust_scale(pairs)
    for (name, pass_name), cs in sorted(groups.items()):
        if len(cs) < MIN_COMMON:
            continue
        others = [s for g, s in theirs.items() if g != (name, pass_name)]
        unpaired = [c for c in cs if not c.parent]
        got = (_parent_change(noise, name, pass_name, cs)
               or (_history_change(noise, name, pass_name, kinds[(name, pass_name)],
                                   unpaired, others) if len(unpaired) >= MIN_COMMON else None))
        if got is None:
            continue
        d, spread, runs, n_base, tail, against = got
        alpha = (CANDIDATE_ALPHA / max(n_changed, 1) if changed(name)
                 else CANDIDATE_ALPHA * UNCHANGED_SHARE / max(n_same, 1))
        if runs > 1:  # confirmed: one of up to two looks (module doc, 7.)
            alpha *= LOOK_SHARE
        ds = [c.d for c in cs]
        cand = CandidateChange(name, pass_name, len(cs), math.exp(d), spread,
                               spread.p_up(d, n_base, tail, runs), alpha, cs[0].yardstick,
                               bar=bar(spread, n_base, alpha, tail, runs), runs=runs,
                               changed=changed(name), mean_ratio=math.exp(statistics.fmean(ds)),
                               one_chip=all(c.one_chip for c in cs), against=against,
                               n_base=n_base, tail_df=tail)
        if cand.p_value < alpha and d >= math.log1p(MIN_CHANGE):
            cand.verdict = "regression"
        out.candidates.append(cand)


Change = tuple[float, Spread, int, int, float, str]  # d, spread, runs, n_base, tail, against


def _parent_change(noise: NoiseModel, name: str, pass_name: str,
                   cs: Sequence[CaseChange]) -> Change | None:
    """A candidate whose cases were judged against the parent's code timed on this run's
    GPU (their history on other chips): the two-sample test of
    harness.records.same_runner over those cases (module doc, 7.)."""
    paired = [c for c in cs if c.parent]
    if len(paired) < MIN_COMMON:
        return None
    pairs = candidate_pairs(noise, name, pass_name, False, stat=statistics.fmean)
    got = same_runner.change([c.logs for c in paired], [c.parent for c in paired],
                             robust_scale(pairs) if len(pairs) >= 2 else None)
    if got is None:
        return None
    d, spread, runs, n_base = got
    return d, spread, runs, n_base, CANDIDATE_TAIL_DF, "parent"


def _history_change(noise: NoiseModel, name: str, pass_name: str, kind: bool | None,
                    cs: Sequence[CaseChange], others: Sequence[float]) -> Change | None:
    """The candidate's change against its baseline window (module doc, 3. and 6.)."""
    runs = min(c.runs for c in cs)  # a confirmation re-times all the cases it timed
    # A few cases confirmed by several runs on one chip: their mean (module doc, 6.).
    # Across chips a case's excursion is the chip's, which runs on it do not average.
    few_confirmed = (len(cs) < ROBUST_CASES and runs >= CONFIRMED_MEAN_RUNS
                     and all(c.one_chip for c in cs))
    if few_confirmed:
        pairs, centre = candidate_pairs(noise, name, pass_name, kind,
                                        stat=statistics.fmean), 0.0
    else:
        pairs, centre = centred(candidate_pairs(noise, name, pass_name, kind), len(cs))
    prior = statistics.median(others) if others else statistics.median(
        c.spread.value for c in cs)
    spread = Spread.moderate(pairs, prior)
    if spread is None:
        return None
    n_base = int(statistics.median(c.n_base for c in cs))
    # The centre was seen between two runs; between the mean of `runs` runs and of
    # n_base the differences, and so the smallest of them, spread
    # sqrt((1/runs + 1/n) / 2) as much.
    ds = [c.d for c in cs]
    d = (statistics.fmean(ds) if few_confirmed else
         candidate_change(ds) - centre * diff_scale(runs, n_base) / math.sqrt(2.0))
    tail = ACROSS_TAIL_DF if not all(c.one_chip for c in cs) else CANDIDATE_TAIL_DF
    return d, spread, runs, n_base, tail, "history"


