"""Confirmation runs: a suspect candidate timed again before its commit is judged.

The level a run reads is drawn when its timing process and buffers are set up, not while
it times: the two halves of one run's samples agree to 0.1%, consecutive runs of one
chip differ by 0.14-0.6% (docs/regressions.md, "Where the run-to-run noise comes from").
So one run a commit cannot resolve a 2% slowdown of a kernel whose run-to-run spread is
0.5%, and timing longer in the same process does not help; timing it again in fresh
processes does: the mean of `runs` independent runs has 1/sqrt(runs) of the spread, and
the difference with the baseline window of n runs sqrt(1/runs + 1/n)
(harness.records.verdict_history.diff_scale).

A two-stage design (screening, then confirmation):
1. The run is judged as it would be (`preliminary`: the gate's own baseline and noise
   model, nothing stored), and each owned candidate whose source the commit changed (or
   whose source is unknown) and whose pooled change reads slower by at least
   `SUSPECT_MIN` at a one-sided p below `SUSPECT_P` is a suspect (`suspects`). A
   candidate the commit did not change gets a twentieth of the level at its commit
   (verdict_stats, 3.): its slowdown is the step search's, across commits, and timing
   it again would spend the runner's time where no step is expected.
2. The gate times each suspect's timed cases `CONFIRM_RUNS` more times, each in a fresh
   timing child, and the medians go into the record (`confirm_ms` of each entry,
   `with_confirmations`). The stored run is then judged on the mean of its runs
   (harness.records.verdict_stats).

The final test is the same test at the same level on more data, so the false alarm rate
is not raised by the screen: P(screened and rejected) <= P(rejected on the mean) =
alpha. What the screen saves is time: a commit that changed nothing re-times a candidate
with probability about SUSPECT_P, not always. The screen is loose because a missed
suspect is a missed slowdown: a 2% step is screened in unless its run read under
about +0.5%.

3. Where the gate can time the parent commit's code of the candidate on the same runner
   (a git worktree of the parent; harness.runs.gate_confirm), it does so as many times,
   interleaved with the confirmations, and those medians (`parent_ms`) are the
   baseline the candidate is judged against (harness.records.same_runner; verdict_stats,
   7.): the baseline's code on this chip, in the same minutes, where the window of
   earlier commits at the baseline's code can be a single run (a commit that changed
   the candidate often follows other changes of it) or ran on other chips. A parent
   timing counts only if it timed the baseline's source hash (the gate checks it).

4. A step the step search would confirm at this commit (harness.records.step_gate: two
   commits at a new level, a candidate's mean or one case) is a suspect too, whether the
   commit changed the candidate or not: it is the search's false alarms that a long
   history meets (a short run of noisy commits read as a step of a whole candidate), and
   the search reads a commit as the geometric mean of its runs, so a newest point
   timed five times stands where the code really is. Its parent's code is not timed
   (the step is across commits, not against the parent).

5. Across chips (the baseline's runs on other GPUs of the model) one run cannot tell a 2%
   slowdown from the chip's offset, so where the parent's code can be timed, every
   owned candidate the commit changed is a suspect, and it is judged against its
   parent's code on this runner (harness.records.same_runner).

6. Two looks. After the first round the run is judged again (`preliminary` with the
   confirmations in the record); a suspect not red whose p is still below `EXTEND_P`
   is timed a second round (and its parent's code as often), and judged on all of
   them. A confirmed candidate is tested at half its level at either look
   (harness.records.verdict_stats, 7.), so the two looks together keep the level.
   The second round is sized from what the first one read (`second_round`): as many
   runs, between the first round's and `MAX_CONFIRM_RUNS`, as give a slowdown of
   `TARGET_STEP` a chance of `TARGET_POWER` to be red at the second look, with the
   spread the first look estimated, at the candidate's level (the power of Student's t
   test from the noncentral t distribution; re-estimating the sample size from an
   internal pilot, as Wittes and Brittain 1990, "The role of internal pilot studies in
   increasing the efficiency of clinical trials", Stat. Med. 9). A kernel of a few
   noisy cases (a teaching kernel's two cases move 1% run to run) needs twice the
   runs of one of many, and its runs are the cheap ones. The size depends on the
   spread only, never on the change read, so the level is kept, up to the slight
   excess such internal-pilot designs are known to have (bench/gate_verdicts.py's
   no-op rows measure what a team sees).

The noise model reads each run's own median only (`median_ms`): the spread it estimates
is one run's, which is what `runs` divides.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from harness.records.compare import DEFAULT_POLICY, Policy, Report, compare_records
from harness.records.db.database import Database
from harness.records.db.queries import baseline_runs, get_run, load_record
from harness.records.noise import from_db as noise_from_db
from harness.records.record import RunRecord, entry_pass, parse_time
from harness.records.verdict_history import ROBUST_CASES
from harness.records.verdict_types import MIN_CHANGE

SUSPECT_P = 0.2  # one-sided p of the candidate's pooled slowdown that earns confirmation
SUSPECT_MIN = 0.005  # ... and the smallest pooled slowdown that does
# A candidate of fewer cases than verdict_history.ROBUST_CASES reads by its least-moved
# case at first; its cases' mean this much slower makes it a suspect too (confirmed, it is
# judged by that mean: verdict_stats, 6.).
FEW_CASES_MEAN = 0.0
CONFIRM_RUNS = 4  # the gate's default: runs added to a suspect's one
MAX_CONFIRM_RUNS = 8
# A suspect the first round left undecided at a p below this is timed a second round
# (module doc, 6.); under no change about this share of the suspects is.
EXTEND_P = 0.05
MAX_SUSPECTS = 4  # candidate-passes confirmed per run, the most significant first
# The second round's size (module doc, 6.): the slowdown it is sized to make red at the
# second look (the whole-kernel step a team's gate must catch at its commit), and with
# what chance.
TARGET_STEP = 0.02
TARGET_POWER = 0.95

Key = tuple[str, str, str]  # (candidate, pass, case id)
FIELDS = ("confirm_ms", "parent_ms")


@dataclass(frozen=True)
class Suspect:
    variant: str
    pass_name: str
    ratio: float  # the pooled change of its cases, new over baseline (a step's ratio)
    p_value: float  # one-sided, slower (nan for a step)
    step: str | None = None  # the step search's range "last_good..first_bad", if that
    runs: int | None = None  # a second round's size (`second_round`); None: the first's


def baseline_sources(db: Database, record: RunRecord, *, branch: str = "main",
                     window: int = 5, baseline_run: str | int | None = None) -> dict[str, str]:
    """The source hash of each candidate in the newest run of `record`'s baseline (the
    code a parent timing must have timed to count as the baseline's)."""
    bases = _bases(db, record, branch=branch, window=window, baseline_run=baseline_run)[1]
    if not bases:
        return {}
    kernels = load_record(db, bases[0].id).kernels
    return {k: str(v.get("source_hash") or "") for k, v in kernels.items()}


def _bases(db: Database, record: RunRecord, *, branch: str, window: int,
           baseline_run: str | int | None) -> tuple[str, list[Any]]:
    if baseline_run is not None:
        run = get_run(db, baseline_run)
        return f"run {run.id}", [run]
    # baseline_runs reads these fields of a stored run; this one is not stored yet.
    ghost = SimpleNamespace(id=None, commit=record.commit, parent_commit=record.parent,
                            gpu_model_key=record.gpu_model_key, grids=record.grids,
                            created_at=parse_time(record.created_at))
    return baseline_runs(db, ghost, branch=branch, window=window)  # type: ignore[arg-type]


def preliminary(db: Database, record: RunRecord, *, policy: Policy = DEFAULT_POLICY,
                branch: str = "main", window: int = 5, baseline_run: str | int | None = None
                ) -> Report | None:
    """The verdicts `record` (not stored) would get now, as the gate gives them: its
    baseline (`baseline_run`, else the parent commit's run or the recent runs of
    `branch`, db.queries.baseline_runs) and the noise model of every stored run. None when
    there is no baseline."""
    how, bases = _bases(db, record, branch=branch, window=window, baseline_run=baseline_run)
    if not bases:
        return None
    noise = noise_from_db(db, record.gpu_model_key, before_run_id=None)
    return compare_records([load_record(db, b.id) for b in bases], record, policy,
                           base_label=how, noise=noise)


def suspects(report: Report | None, owned: Sequence[str] | None = None,
             steps: Sequence[Suspect] = ()) -> list[Suspect]:
    """The owned candidate-passes of `report` worth timing again (module doc, 1.), the
    most significant first, then those of `steps` (`step_suspects`, `across_suspects`)
    not already among them; at most MAX_SUSPECTS. `owned`: the team's candidates (None:
    every candidate that is not a yardstick in the report)."""
    if report is None:
        return []
    out = [Suspect(c.variant, c.pass_name, c.ratio, c.p_value) for c in report.candidates
           if not c.yardstick and c.changed and (owned is None or c.variant in owned)
           and ((c.p_value < SUSPECT_P and c.ratio >= 1.0 + SUSPECT_MIN)
                or (c.cases < ROBUST_CASES and c.mean_ratio >= 1.0 + FEW_CASES_MEAN))]
    out.sort(key=lambda s: s.p_value)
    have = {(s.variant, s.pass_name) for s in out}
    yard = {c.variant for c in report.candidates if c.yardstick}
    for s in steps:
        if ((s.variant, s.pass_name) not in have and s.variant not in yard
                and (owned is None or s.variant in owned)):
            out.append(s)
            have.add((s.variant, s.pass_name))
    return out[:MAX_SUSPECTS]


def across_suspects(db: Database, record: RunRecord, *, branch: str = "main",
                    window: int = 5, baseline_run: str | int | None = None
                    ) -> list[Suspect]:
    """Where a run of `record`'s baseline ran on another GPU (or a uuid is unknown, as
    harness.records.compare reads a comparison across chips): each owned candidate-pass
    whose source the commit changed and that the run timed (module doc, 5.), whatever it
    read: one run cannot tell its change from the chip's. Its ratio is the geometric mean of its cases' medians over the newest base
    run's (for the log); its p is nan. Only worth asking where the parent's code can be
    timed on this runner."""
    bases = _bases(db, record, branch=branch, window=window, baseline_run=baseline_run)[1]
    dev = (record.gpu or {}).get("uuid")
    if not bases or (dev and all(b.gpu_uuid == dev for b in bases)):
        return []  # one chip: the screen of `suspects` reads it
    newest = load_record(db, bases[0].id)
    base_ms = {(e["kernel"], entry_pass(e), e.get("case_id")): e.get("median_ms")
               for e in newest.results if e.get("status") == "passed"}
    logs: dict[tuple[str, str], list[float]] = {}
    for e in record.results:
        name = e["kernel"]
        info = record.kernels.get(name) or {}
        src = str(info.get("source_hash") or "")
        if not info.get("owned") or (src and src == str(
                (newest.kernels.get(name) or {}).get("source_hash") or "")):
            continue
        key = (name, entry_pass(e), e.get("case_id"))
        new, old = e.get("median_ms"), base_ms.get(key)
        if e.get("status") == "passed" and new and old:
            logs.setdefault(key[:2], []).append(math.log(float(new) / float(old)))
    return [Suspect(name, pass_name, math.exp(sum(xs) / len(xs)), math.nan)
            for (name, pass_name), xs in sorted(logs.items())]


def extend(report: Report | None, found: Sequence[Suspect], first: int = CONFIRM_RUNS
           ) -> list[Suspect]:
    """The suspects of `found` (not steps) that `report`, the run judged again with its
    first round of `first` confirmation runs, leaves undecided: not red, read slower, at
    a p below `EXTEND_P` (module doc, 6.). Each is timed a second round of
    `Suspect.runs` runs (`second_round`)."""
    if report is None:
        return []
    by = {(c.variant, c.pass_name): c for c in report.candidates}
    out = []
    for s in found:
        c = by.get((s.variant, s.pass_name))
        if (not s.step and c is not None and c.verdict != "regression" and c.ratio > 1.0
                and c.p_value < EXTEND_P and c.runs > 1):
            out.append(Suspect(s.variant, s.pass_name, c.ratio, c.p_value,
                               runs=second_round(c, first)))
    return out


def second_round(c: Any, first: int) -> int:
    """The runs of a second round for candidate `c` (a verdict_types.CandidateChange of
    the first look, `first` runs a round): the fewest, from `first` to
    `MAX_CONFIRM_RUNS`, whose power against a `TARGET_STEP` slowdown at the second look
    reaches `TARGET_POWER` (module doc, 6.). Each run of the commit's code is matched by
    one of its parent's where the candidate is judged against the parent (its degrees of
    freedom grow with them); against the history's window only the commit's side
    grows."""
    from scipy import stats

    from harness.records.verdict_history import diff_scale

    first = max(1, min(first, MAX_CONFIRM_RUNS))
    if not (c.spread.value > 0 and math.isfinite(c.spread.value) and 0 < c.alpha < 1):
        return first
    paired = c.against == "parent"
    for k in range(first, MAX_CONFIRM_RUNS + 1):
        n_base = c.n_base + k if paired else c.n_base
        df = min(c.spread.df + (2 * k if paired else 0), c.tail_df)
        scale = c.spread.value * diff_scale(c.runs + k, n_base)
        crit = max(float(stats.t.isf(c.alpha, df)), math.log1p(MIN_CHANGE) / scale)
        if float(stats.nct.sf(crit, df, math.log1p(TARGET_STEP) / scale)) >= TARGET_POWER:
            return k
    return MAX_CONFIRM_RUNS


def step_suspects(db: Database, record: RunRecord) -> list[Suspect]:
    """The candidate-passes whose step the step search would confirm at `record`'s
    commit, not yet reported (harness.records.step_gate), with `record` (not stored) as
    the newest point of each series (module doc, 4.)."""
    from harness.records.step_gate import confirmed_steps, history_with_chips, unreported
    from harness.records.verdict_history import run_logs

    owned = sorted(k for k, v in record.kernels.items() if v.get("owned"))
    commit = record.commit
    if not commit or not owned:
        return []
    series, sources, chips = history_with_chips(db, record.gpu_model_key, upto_run_id=None,
                                                kernels=owned)
    device = (record.gpu or {}).get("uuid") or ""
    for e in record.results:
        key = (e["kernel"], entry_pass(e), e.get("case_id"))
        logs = run_logs(e) if e["kernel"] in owned and e.get("status") == "passed" else []
        if not logs:
            continue
        pts = [(c, m) for c, m in series.get(key, []) if c != commit]
        series[key] = [*pts, (commit, math.exp(sum(logs) / len(logs)))]
        src = str((record.kernels.get(e["kernel"]) or {}).get("source_hash") or "")
        sources.setdefault(key[:2], {}).pop(commit, None)
        sources[key[:2]][commit] = src
        chips.setdefault(key[:2], {}).pop(commit, None)
        chips[key[:2]][commit] = device
    steps = unreported(db, record.gpu_model_key, -1, series,
                       confirmed_steps(series, commit, sources, chips))
    found: dict[tuple[str, str], Suspect] = {}
    for (name, pass_name, _case), st in sorted(steps.items()):
        if st.direction == "regression" and (name, pass_name) not in found:
            found[(name, pass_name)] = Suspect(name, pass_name, st.ratio, math.nan,
                                               step=f"{st.last_good[:12]}..{st.first_bad[:12]}")
    return list(found.values())


def timed_keys(record: RunRecord, variant: str, pass_name: str) -> list[Key]:
    """The passed, timed entries of one candidate-pass: what a confirmation re-times."""
    return [(e["kernel"], entry_pass(e), e["case_id"]) for e in record.results
            if e["kernel"] == variant and entry_pass(e) == pass_name
            and e.get("status") == "passed" and e.get("median_ms")]


def with_confirmations(record: RunRecord, medians: Mapping[Key, Sequence[float]],
                       field: str = "confirm_ms") -> int:
    """Add confirmation medians (`field` "confirm_ms": the commit's own; "parent_ms": its
    parent's code, timed by this run) to the record's passed, timed entries (in place);
    returns how many entries got any. A median that is not a positive finite number is
    left out, as is an entry the record did not time."""
    if field not in FIELDS:
        raise ValueError(f"not a confirmation field: {field!r}")
    n = 0
    for e in record.results:
        key = (e["kernel"], entry_pass(e), e.get("case_id"))
        more = [float(m) for m in medians.get(key, ())  # type: ignore[call-overload]
                if isinstance(m, int | float) and 0 < float(m) < float("inf")]
        if more and e.get("status") == "passed" and e.get("median_ms"):
            e[field] = [*e.get(field, []), *more][:MAX_CONFIRM_RUNS * 2]
            n += 1
    return n


def confirmed_note(record: RunRecord) -> list[dict[str, Any]]:
    """What was confirmed in a record, per candidate-pass: runs and cases."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for e in record.results:
        if e.get("confirm_ms"):
            k = (e["kernel"], entry_pass(e))
            s = seen.setdefault(k, {"kernel": k[0], "pass": k[1], "cases": 0, "runs": 0})
            s["cases"] += 1
            s["runs"] = max(s["runs"], 1 + len(e["confirm_ms"]))
    return list(seen.values())
