"""Regression detection between a run and its baseline, per (kernel, case, GPU model).

A timing change is a `regression` (or `improvement`) only when these rules agree, because
each one alone is known to cry wolf:

1. practical size: the estimated ratio new / base is beyond 1 +- `threshold` (2%;
   with a noise model, per case from its run-to-run history: `NoiseModel.threshold`);
   smaller changes are not worth a red CI even when real. The ratio is
   1 + (Hodges-Lehmann shift) / (base median): the median of all pairwise differences is
   as robust to outliers as a median but much less noisy than a ratio of two medians
   (at 20 samples a side it misses a 3% change far less often);
2. statistics on the raw samples: a two-sided Mann-Whitney U test gives p < `alpha`, so a
   ratio produced by noise in a noisy case does not count (asv uses ratio AND p-value);
3. robust intervals: the distribution-free confidence intervals of the two medians (order
   statistics, binomial) must not overlap. Medians and order statistics ignore the outlier
   samples that inflate a mean or a standard deviation, which is how identical builds got
   flagged by rules built on means and stdevs (nvbench#316, conbench's z-scores).
4. each run's own level: the change must exceed how far the level of one run moved while
   it was timed: the medians of consecutive quarters of its samples, in the order taken
   (`level_range`), in the new run or the base runs (their median, for a window). Rules 2
   and 3 take the samples as independent draws around one level; a run whose level moves
   while it is timed breaks that, and its samples then call any change at that scale
   certain. On an H100 (2026-12-06, results/h100-20261206) fa2_mma's d128 timings sat at
   two levels 2% apart by turns within one `ci` run (quarters 0.962, 0.941, 0.941, 0.962
   ms; SM clock 1980 MHz throughout), and the U test called a 2.1% change between two
   runs of the same commit certain (p = 4e-45). Quarters, not halves: by turns, a run's
   two halves can hold both levels alike. Judged as `fa-harness import` judges it, the
   committed history keeps 159 of its 187 regressions and improvements; the other 28, all
   on perf shapes whose runs moved 1.8-9.6% within themselves, become inconclusive (11 of
   them the SDPA peers', whose code did not change). `bench/detection_power.py` measures
   what the rule costs (docs/regressions.md).

5. the clock (`_clock_explains`): with no run-to-run spread to judge by, a change that the
   change of SM clock between the two timings explains is left open.

When the ratio is beyond the threshold but the other rules do not confirm it, the verdict
is `inconclusive` (shown, never failing). With too few samples for a test (single medians,
e.g. imported summaries) only a large change (`large_ratio`, 10%) is called.

Correctness is compared too: passed before and not now is `correctness_regression`;
an error ratio (out_err / base_err, the metric the tolerance rule bounds by 2) that rises
by `drift_factor` (1.5x) and above `drift_floor` (1.0) is `precision_drift`. Both fail
the gate like a timing regression.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from scipy import stats

from harness.records.noise import NoiseModel, judge, whole_candidate_only
from harness.records.record import RunRecord, entry_pass
from harness.records.sample_stats import hodges_lehmann_shift, level_bar, median_interval

OK_STATUSES = ("passed", "skipped")
FAILING_VERDICTS = ("regression", "correctness_regression", "precision_drift")


class CompareError(ValueError):
    """The two sides cannot be compared (different GPU models, nothing in common...)."""


@dataclass(frozen=True)
class Policy:
    threshold: float = 0.02  # practical: |ratio - 1| beyond this
    alpha: float = 0.01  # Mann-Whitney U two-sided p-value below this
    interval_conf: float = 0.90  # confidence of each median's interval
    min_samples: int = 5  # per side, for the statistical rules
    large_ratio: float = 0.10  # without samples, only a change this large is called
    drift_factor: float = 1.5  # precision drift: new error ratio >= factor * base ...
    drift_floor: float = 1.0  # ... and above this (the tolerance rule allows up to 2)


DEFAULT_POLICY = Policy()


@dataclass
class Verdict:
    variant: str
    case_id: str
    verdict: str
    ratio: float | None = None
    p_value: float | None = None
    base_median_ms: float | None = None
    new_median_ms: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    pass_name: str = "fwd"  # the forward's and the backward's verdicts are separate entries
    # The baseline run whose entry this verdict was judged against (the newest of the
    # window that holds this candidate, pass and case; the others only pooled samples),
    # by uuid: where "base vs new" links must point.
    base_uuid: str | None = None

    @property
    def label(self) -> str:
        """The candidate as tables name it: `fa2_mma`, and `fa2_mma (bwd)` for its backward."""
        return self.variant if self.pass_name == "fwd" else f"{self.variant} ({self.pass_name})"

    @property
    def fails(self) -> bool:
        # A candidate or case of the baseline that is gone from this run fails too (a
        # kernel that silently drops out must not pass), unless the caller knows why it
        # was left out (the gate's plan, --kernels) and says so in detail["excused"].
        if self.verdict == "missing":
            return not self.detail.get("excused")
        return self.verdict in FAILING_VERDICTS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_samples(base: Sequence[float], new: Sequence[float],
                    policy: Policy = DEFAULT_POLICY, *, base_median: float | None = None,
                    new_median: float | None = None,
                    level: float | None = None) -> tuple[str, float | None,
                                                         float | None, dict[str, Any]]:
    """Timing verdict from raw samples (or medians alone): (verdict, ratio, p, detail).
    `level`: rule 4's bar in log units (`level_bar`; None: unknown, the rule is not
    applied)."""
    bm = statistics.median(base) if base else base_median
    nm = statistics.median(new) if new else new_median
    detail: dict[str, Any] = {"n_base": len(base), "n_new": len(new)}
    if bm is None and nm is None:
        # A correctness-only result on both sides (a CPU run, a case left untimed): there
        # is no timing to compare, which is not an open question.
        return "same", None, None, {**detail, "reason": "not timed on either side"}
    if bm is None or nm is None or bm <= 0:
        return "inconclusive", None, None, {**detail, "reason": "no timing on one side"}
    ratio = nm / bm
    detail.update(base_median_ms=bm, new_median_ms=nm, median_ratio=ratio)
    if len(base) < policy.min_samples or len(new) < policy.min_samples:
        detail["reason"] = f"fewer than {policy.min_samples} samples on a side: median ratio only"
        direction = "regression" if ratio > 1.0 else "improvement"
        if abs(ratio - 1.0) > policy.large_ratio:
            return direction, ratio, None, detail
        return ("inconclusive" if abs(ratio - 1.0) > policy.threshold else "same"), ratio, \
            None, detail
    ratio = 1.0 + hodges_lehmann_shift(base, new) / bm
    beyond = abs(ratio - 1.0) > policy.threshold
    direction = "regression" if ratio > 1.0 else "improvement"
    p = float(stats.mannwhitneyu(new, base, alternative="two-sided").pvalue)
    b_lo, b_hi = median_interval(base, policy.interval_conf)
    n_lo, n_hi = median_interval(new, policy.interval_conf)
    separated = n_lo > b_hi if ratio > 1.0 else n_hi < b_lo
    held = level is None or (ratio > 0 and abs(math.log(ratio)) > level)
    detail.update(base_interval_ms=[b_lo, b_hi], new_interval_ms=[n_lo, n_hi],
                  rules={"ratio": beyond, "p_value": p < policy.alpha, "intervals": separated,
                         "levels": held})
    if level is not None:
        detail["level_range"] = level
    if not beyond:
        return "same", ratio, p, detail
    if p < policy.alpha and separated and held:
        return direction, ratio, p, detail
    detail["reason"] = "ratio beyond threshold, not confirmed by " + " and ".join(
        name for name, ok in (("the U test", p < policy.alpha), ("the intervals", separated),
                              (f"each run's own level (its quarters up to "
                               f"{math.expm1(level or 0.0):.2%} apart)", held))
        if not ok)
    return "inconclusive", ratio, p, detail


def _num(x: Any) -> float | None:
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def compare_entries(base: Sequence[dict[str, Any]], new: dict[str, Any],
                    policy: Policy = DEFAULT_POLICY) -> Verdict:
    """Verdict of one new result entry against the base entries of the same kernel, pass
    and case (newest first; several when the baseline is a window of runs)."""
    verdict = _compare_entries(base, new, policy)
    verdict.pass_name = entry_pass(new)
    return verdict


def _compare_entries(base: Sequence[dict[str, Any]], new: dict[str, Any],
                     policy: Policy) -> Verdict:
    kernel, case_id = new["kernel"], new["case_id"]
    if not base:
        return Verdict(kernel, case_id, "new", detail={"reason": "not in the baseline"})
    latest = base[0]
    new_ok = new["status"] in OK_STATUSES
    if latest["status"] == "passed" and not new_ok:
        return Verdict(kernel, case_id, "correctness_regression",
                       detail={"base_status": latest["status"], "new_status": new["status"],
                               "message": new.get("message", "")})
    if latest["status"] not in OK_STATUSES and new["status"] == "passed":
        return Verdict(kernel, case_id, "correctness_fixed",
                       detail={"base_status": latest["status"], "new_status": new["status"]})
    if new["status"] != "passed":
        return Verdict(kernel, case_id, "same", detail={
            "reason": f"status {new['status']} (was {latest['status']})"})

    b_ratio = _num((latest.get("errors") or {}).get("ratio"))
    n_ratio = _num((new.get("errors") or {}).get("ratio"))
    if (b_ratio is not None and n_ratio is not None and n_ratio > policy.drift_floor
            and n_ratio >= policy.drift_factor * b_ratio):
        return Verdict(kernel, case_id, "precision_drift", ratio=n_ratio / b_ratio if b_ratio
                       else None, detail={"base_err_ratio": b_ratio, "new_err_ratio": n_ratio})

    passed_base = [e for e in base if e["status"] == "passed"]
    pooled = [float(x) for e in passed_base for x in (e.get("samples_ms") or [])]
    base_medians = [m for e in passed_base if (m := _num(e.get("median_ms"))) is not None]
    base_median = statistics.median(base_medians) if base_medians and not pooled else None
    new_samples = [float(x) for x in new.get("samples_ms") or []]
    # Rule 4 per run, not on the pooled samples: pooled runs follow one another, and the
    # blocks of the pool would be runs, not one run's level moving.
    level = level_bar([e.get("samples_ms") or [] for e in passed_base], new_samples,
                      policy.min_samples)
    verdict, ratio, p, detail = compare_samples(
        pooled, new_samples, policy, base_median=base_median,
        new_median=_num(new.get("median_ms")), level=level)
    detail["base_runs"] = len(passed_base)
    # The SM clock the timings ran at (median of their samples), when it was read: a
    # power-capped chip slows a long, hot timing by up to 16% (the H100 of 2026-12-05 ran
    # one perf run's timings at 1665-1980 MHz), and a reader must see a change of clock
    # beside a change of time. Never used to correct the time (a kernel that draws more
    # power runs slower on every such chip, and that slowdown is real); without a
    # run-to-run history, a change the clock explains is left open (rule 5).
    base_clocks = [c for e in passed_base if (c := _clock(e)) is not None]
    if base_clocks and (new_clock := _clock(new)) is not None:
        detail.update(base_clock_mhz=statistics.median(base_clocks), new_clock_mhz=new_clock)
    return Verdict(kernel, case_id, verdict, ratio=ratio, p_value=p,
                   base_median_ms=detail.get("base_median_ms"),
                   new_median_ms=detail.get("new_median_ms"), detail=detail)


@dataclass
class Report:
    """All verdicts of one comparison."""

    base_label: str
    new_label: str
    gpu_model_key: str
    verdicts: list[Verdict]
    policy: Policy = DEFAULT_POLICY
    # Each candidate as a whole, where the history knows its noise (verdict_stats).
    candidates: list[Any] = field(default_factory=list)

    @property
    def failing(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.fails]

    @property
    def regressed(self) -> bool:
        return bool(self.failing)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self.verdicts:
            out[v.verdict] = out.get(v.verdict, 0) + 1
        return dict(sorted(out.items()))

    def to_dict(self) -> dict[str, Any]:
        return {"base": self.base_label, "new": self.new_label,
                "gpu_model_key": self.gpu_model_key, "regressed": self.regressed,
                "counts": self.counts(), "policy": asdict(self.policy),
                "verdicts": [v.to_dict() for v in self.verdicts]}

    def markdown(self, *, limit: int = 50) -> str:
        lines = [f"**Baseline:** {self.base_label}  ", f"**This run:** {self.new_label}  ",
                 f"**GPU model:** `{self.gpu_model_key}`", ""]
        c = self.counts()
        lines.append("Verdicts: " + (", ".join(f"{k} {n}" for k, n in c.items()) or "none"))
        shown = [v for v in self.verdicts if v.verdict not in ("same", "new")]
        # What fails first, then what changed for the better, the open questions last.
        order = {"correctness_regression": 0, "regression": 1, "precision_drift": 2,
                 "missing": 3, "correctness_fixed": 4, "improvement": 5, "inconclusive": 6}
        shown.sort(key=lambda v: (order.get(v.verdict, 9), -(abs((v.ratio or 1.0) - 1.0))))
        if shown:
            lines += ["", "| verdict | kernel | case | base ms | new ms | ratio | p | SM MHz |",
                      "|---|---|---|---|---|---|---|---|"]
            for v in shown[:limit]:
                lines.append(f"| {v.verdict} | `{v.label}` | `{v.case_id}` | "
                             f"{_fmt(v.base_median_ms)} | {_fmt(v.new_median_ms)} | "
                             f"{_fmt(v.ratio, '.3f')} | {_fmt(v.p_value, '.2g')} | "
                             f"{_clocks(v)} |")
            if len(shown) > limit:
                lines.append(f"\n... and {len(shown) - limit} more")
            # An open question says which rule left it open: a table row cannot.
            why = [v for v in shown[:limit] if v.verdict == "inconclusive"
                   and v.detail.get("reason")]
            if why:
                lines += ["", "Why inconclusive:"]
                lines += [f"- `{v.label}` `{v.case_id}`: {v.detail['reason']}" for v in why]
        return "\n".join(lines) + "\n"


def _clock(entry: dict[str, Any]) -> float | None:
    return _num((entry.get("extra") or {}).get("sm_clock_mhz"))


def _clock_explains(v: Verdict) -> None:
    """Rule 5: without a run-to-run spread to judge by (no noise model, or too little
    history), a timing change that the change of SM clock between the two timings
    explains is `inconclusive`: one that is no larger than the clocks' ratio and goes its
    way (clock down and slower, or up and faster; time at most inversely proportional to
    the clock). Two runs alone cannot tell a kernel that draws more power from a chip whose
    power and thermal state moved the clock. On an H100 (2026-12-06, results/h100-20261206)
    five `ci` runs of one commit on one chip timed fa3_wgmma's d128 N2048 bf16 case at
    1815-1935 MHz, and the second run, with one run of history, called a 4.7% improvement
    at 1815 -> 1935 MHz certain (p = 3e-127). With a spread known, the noise model judges:
    runs of one chip whose clocks moved are in that spread, and a change beyond it counts,
    whatever the clock did."""
    if v.verdict not in ("regression", "improvement") or "run_to_run_spread" in v.detail:
        return
    b, n = v.detail.get("base_clock_mhz"), v.detail.get("new_clock_mhz")
    if not b or not n or v.ratio is None or v.ratio <= 0 or abs(n - b) < 0.01 * b:
        return
    size, clock = math.log(v.ratio), math.log(b / n)   # both > 0: slower, clock down
    if size * clock > 0 and abs(size) <= abs(clock):
        v.detail["reason"] = (f"the SM clock moved {b:.0f} -> {n:.0f} MHz (up to "
                              f"{math.expm1(abs(clock)):.1%} of time); no run-to-run "
                              "history to judge by")
        v.verdict = "inconclusive"


def _clocks(v: Verdict) -> str:
    """"1980 -> 1770" where both timings' clocks are known and differ by 1% or more."""
    b, n = v.detail.get("base_clock_mhz"), v.detail.get("new_clock_mhz")
    if b is None or n is None or abs(n - b) < 0.01 * b:
        return ""
    return f"{b:.0f} -> {n:.0f}"


def _fmt(x: float | None, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def _index(entries: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Entries by (kernel, pass, case): a kernel's forward and backward never meet."""
    return {(e["kernel"], entry_pass(e), e["case_id"]): e for e in entries}


def compare_records(base: RunRecord | Sequence[RunRecord], new: RunRecord,
                    policy: Policy = DEFAULT_POLICY, *, base_label: str | None = None,
                    noise: NoiseModel | None = None) -> Report:
    """Compare `new` with one baseline record or a window of them (any order; the newest
    decides the baseline status, all passed ones pool their samples). With `noise` (the
    run-to-run spread from history, harness.records.noise) a timing change within that
    spread is "same", and a verdict without enough history says so. Raises CompareError
    when a baseline run is of another GPU model."""
    bases = [base] if isinstance(base, RunRecord) else list(base)
    if not bases:
        raise CompareError("no baseline run to compare with")
    key = new.gpu_model_key
    other = sorted({b.gpu_model_key for b in bases if b.gpu_model_key != key})
    if other:
        raise CompareError(f"runs are of different GPU models ({', '.join(other)} vs {key}); "
                           "timings are only compared on the same GPU model")
    bases.sort(key=lambda r: r.created, reverse=True)
    indexes = [_index(b.results) for b in bases]
    verdicts = []
    by_base: dict[tuple[str, str, str], list[RunRecord]] = {}
    new_index = _index(new.results)
    for k, entry in new_index.items():
        # The practical threshold of this (candidate, pass, case): the noise model's
        # when its history knows the run-to-run spread (harness.records.noise), of runs
        # on one chip or across chips as this comparison is.
        by_base[k] = [b for b, ix in zip(bases, indexes, strict=True) if k in ix]
        across = _across(new, by_base[k])
        own = policy if noise is None else replace(
            policy, threshold=noise.threshold(k, policy.threshold, across))
        v = compare_entries([ix[k] for ix in indexes if k in ix], entry, own)
        if own.threshold != policy.threshold:
            v.detail["threshold"] = own.threshold
        if noise is not None:
            source = (new.kernels.get(k[0]) or {}).get("source_hash") or ""
            v.verdict = judge(v.verdict, v.ratio, noise.spread(k, across),
                              noise.history(k, across), v.detail, practical=policy.threshold,
                              seen=noise.seen_range(k, source),
                              new_median=entry.get("median_ms"), across=across)
        _clock_explains(v)
        v.base_uuid = next((b.uuid for b, ix in zip(bases, indexes, strict=True) if k in ix),
                           None)
        verdicts.append(v)
    if noise is not None:
        whole_candidate_only(verdicts, lambda k: _across(new, by_base.get(k, [])))
    decided = None if noise is None else _decide(verdicts, new, bases, indexes, new_index,
                                                      noise)
    for k in sorted({k for ix in indexes for k in ix} - set(new_index)):
        holder = next(b.uuid for b, ix in zip(bases, indexes, strict=True) if k in ix)
        verdicts.append(Verdict(k[0], k[2], "missing", detail={"reason": "not in this run"},
                                pass_name=k[1], base_uuid=holder))
    verdicts.sort(key=lambda v: (v.variant, v.pass_name, v.case_id))
    label = base_label or ", ".join(_label(b) for b in bases[:3]) + (
        f" (+{len(bases) - 3} more)" if len(bases) > 3 else "")
    return Report(base_label=label, new_label=_label(new), gpu_model_key=key,
                  verdicts=verdicts, policy=policy,
                  candidates=decided.candidates if decided is not None else [])


def _decide(verdicts: list[Verdict], new: RunRecord, bases: Sequence[RunRecord],
            indexes: Sequence[dict[tuple[str, str, str], dict[str, Any]]],
            new_index: dict[tuple[str, str, str], dict[str, Any]], noise: NoiseModel) -> Any:
    """The history-aware verdicts of the whole run (harness.records.verdict_stats)."""
    from harness.records.verdict_stats import decide

    sources: dict[str, str] = {}
    for b in bases:  # newest first: the baseline's code is its newest run's
        for name, info in b.kernels.items():
            sources.setdefault(name, (info or {}).get("source_hash") or "")
    by_key = {k: [b for b, ix in zip(bases, indexes, strict=True) if k in ix]
              for k in new_index}

    def yardstick(name: str) -> bool:
        info = new.kernels.get(name) or {}
        return info.get("kind") == "peer" or info.get("owned") is False

    def changed(name: str) -> bool:  # unknown on either side: no evidence it did not
        src = (new.kernels.get(name) or {}).get("source_hash") or ""
        return not src or src != sources.get(name, "")

    entries = {k: [ix[k] for ix in indexes if k in ix] for k in new_index}
    return decide(verdicts, new_index, entries, sources, noise,
                  device=(new.gpu or {}).get("uuid") or "",
                  across_of=lambda k: _across(new, by_key.get(k, [])), yardstick=yardstick,
                  changed=changed)


def _across(new: RunRecord, bases: Sequence[RunRecord]) -> bool | None:
    """Whether `new` ran on another chip than any of its baseline runs; None when a GPU
    uuid is unknown."""
    dev = (new.gpu or {}).get("uuid")
    others = [(b.gpu or {}).get("uuid") for b in bases]
    if not dev or not others or not all(others):
        return None
    return any(o != dev for o in others)


def _label(r: RunRecord) -> str:
    commit = (r.commit or "no-commit")[:12]
    return f"{commit} ({r.branch or '-'}, {r.created_at[:19]}, run {r.uuid[:8]})"
