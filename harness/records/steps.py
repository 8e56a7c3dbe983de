"""Steps across commits: where a candidate's timing changed in its commit-ordered history.

A pairwise comparison sees one commit against its parent; a 2% slowdown spread over
three 0.7% commits passes each of them. Here the whole series of one (candidate,
pass, case) on one GPU model (one median per commit, oldest first) is segmented with PELT
(Killick, Fearnhead and Eckley 2012, "Optimal detection of changepoints with a linear
computational cost"; the `ruptures` implementation) on the log medians, so that a step is
a ratio whatever the kernel's speed.

- The cost is least absolute deviation (`l1`), not least squares: the committed H200
  histories hold one +5% run in about 25 (a gate's cold first run), and a squared cost
  cuts such a run off as a segment of its own, which hides the real step next to it.
  The penalty is `PENALTY_K * sigma * log(n)` (the BIC's, in the units of an absolute
  deviation), where sigma is the run-to-run spread of the series itself
  (harness.records.noise.relative_spread: robust to the steps), floored at
  `SIGMA_FLOOR` (a series measured to 0.1% still moves by that much between runs).
- A change point is kept when its step (the difference of the medians of up to `WINDOW`
  commits on either side, not reaching back past the previous step kept) is at least
  `MIN_STEP` and `STEP_K` sigma, and the Mann-Whitney U test between those two windows
  gives p <= `ALPHA`. The windows' medians carry the evidence, so the step need not
  stand out against one run's spread by the gate's 3 sigma: `STEP_K` is 1.5. On
  `bench/detection_steps.py` (the committed H200 noise) it finds 87% of the 2% steps of
  series spread 0.5-1.5% where 2 found 76%, with false alerts as rare (at most 0.03% per
  commit in every band).
- Its commit range: the first bad commit is the first of two points in a row nearer the
  level after than the level before (one slow run just before a step is not where it
  began); the last good one is the last before it still nearer the level before. One
  commit apart for a sharp step; a step spread over several commits names the commits
  around its middle.
- A later step back to within `STEP_K` sigma of the level before marks it recovered.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.records.noise import relative_spread, timed_history

MIN_STEP = 0.01
STEP_K = 1.5
SIGMA_FLOOR = 0.001
PENALTY_K = 2.0
MIN_POINTS = 4
ALPHA = 0.02  # Mann-Whitney U between the WINDOW points on either side of a change
WINDOW = 15
SERIES_RUNS = 30
CONFIRM_POINTS = 2  # a step is a regression once two commits hold the new level ...
CONFIRM_WINDOW = 4  # ... and the gate reports it while its first bad commit is this recent


@dataclass
class Step:
    index: int  # first point of the new level
    last_good: str
    first_bad: str
    ratio: float  # level after / level before (> 1: slower, for times)
    sigma: float
    recovered_at: str | None = None

    @property
    def direction(self) -> str:
        return "regression" if self.ratio > 1.0 else "improvement"

    def to_dict(self) -> dict:
        return {"last_good": self.last_good, "first_bad": self.first_bad,
                "ratio": self.ratio, "direction": self.direction, "sigma": self.sigma,
                "recovered_at": self.recovered_at}


def _p_value(a: Sequence[float], b: Sequence[float]) -> float:
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return 1.0
    return float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)


def find_steps(commits: Sequence[str], medians: Sequence[float], *,
               min_step: float = MIN_STEP) -> list[Step]:
    """The steps of one commit-ordered series of medians (module doc), oldest first."""
    import numpy as np
    import ruptures

    pts = [(c, m) for c, m in zip(commits, medians, strict=True)
           if m is not None and m > 0 and math.isfinite(m)]
    if len(pts) < MIN_POINTS:
        return []
    names = [c for c, _ in pts]
    xs = [math.log(m) for _, m in pts]
    sigma = max(relative_spread([m for _, m in pts]) or 0.0, SIGMA_FLOOR)
    pen = PENALTY_K * sigma * math.log(len(xs))
    algo = ruptures.Pelt(model="l1", min_size=2, jump=1).fit(np.asarray(xs)[:, None])
    bkps = algo.predict(pen=pen)
    tol = STEP_K * sigma
    steps: list[Step] = []
    levels: list[tuple[int, float, float]] = []  # (index, level before, level after)
    prev = 0
    for b in bkps[:-1]:
        # The level on either side: up to WINDOW points, not reaching back past the
        # previous step kept (PELT may cut a heavy-tailed pair of runs off as a segment
        # of its own; the windows look through such cuts).
        left, right = xs[max(prev, b - WINDOW):b], xs[b:b + WINDOW]
        if len(left) < 2 or len(right) < 2:
            continue
        before, after = statistics.median(left), statistics.median(right)
        delta = after - before
        if abs(delta) < max(math.log1p(min_step), tol) or _p_value(left, right) > ALPHA:
            continue  # within the noise, or a short excursion of heavy-tailed noise
        # The range (module doc): two points in a row at the new level start it.
        hi, end = b, min(len(xs), b + WINDOW) - 1
        while hi < end and not (_nearer(xs[hi], after, before)
                                and _nearer(xs[hi + 1], after, before)):
            hi += 1
        lo = hi - 1
        while lo > prev and _nearer(xs[lo], after, before):
            lo -= 1
        steps.append(Step(index=b, last_good=names[lo], first_bad=names[hi],
                          ratio=math.exp(delta), sigma=sigma))
        levels.append((b, before, after))
        prev = b
    # A step undone later: a later step that brings the level back to before it.
    for st, (b, before, _after) in zip(steps, levels, strict=True):
        for later, (b2, _before2, after2) in zip(steps, levels, strict=True):
            if b2 > b and abs(after2 - before) <= tol:
                st.recovered_at = later.first_bad
                break
    return steps


def _nearer(x: float, level: float, other: float) -> bool:
    return abs(x - level) < abs(x - other)


# ---------------------------------------------------------------- the gate's use


def series_from_db(db: Any, gpu_model_key: str | None, *, upto_run_id: int,
                   kernels: Sequence[str], runs: int = SERIES_RUNS
                   ) -> dict[tuple[str, str, str], list[tuple[str, float]]]:
    """(candidate, pass, case) -> [(commit, median)], oldest first: the last `runs`
    stored runs on `gpu_model_key` up to and including run `upto_run_id`, one median per
    commit (its newest run's), passed timed results of `kernels` only."""
    rows = timed_history(db, gpu_model_key, upto_run_id=upto_run_id, runs=runs,
                         include_upto=True, kernels=kernels)
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for name, _src, pass_name, case_id, commit, median, _gpu in rows:
        if commit is not None:
            per_commit = out.setdefault((name, pass_name or "fwd", case_id), {})
            per_commit.pop(commit, None)  # a re-run moves the commit to its newest place
            per_commit[commit] = float(median)
    return {k: list(v.items()) for k, v in out.items()}


def confirmed_steps(series: dict[tuple[str, str, str], list[tuple[str, float]]],
                    commit: str) -> dict[tuple[str, str, str], Step]:
    """The regression steps that `commit` (the newest point of each series) confirms:
    from its first bad commit on, the new level holds `CONFIRM_POINTS` to
    `CONFIRM_WINDOW` commits, the last of them this one, and has not recovered. A
    slowdown spread over small commits that no pairwise comparison flags is caught here
    once it is complete; it stays flagged for the next few commits (an open regression),
    then ages out of the gate (the dashboard's history keeps it)."""
    out = {}
    for key, pts in series.items():
        if len(pts) < MIN_POINTS or pts[-1][0] != commit:
            continue
        found = find_steps([c for c, _ in pts], [m for _, m in pts])
        names = [c for c, _ in pts]
        for st in reversed(found):
            held = len(pts) - names.index(st.first_bad)  # commits at the new level
            if st.direction == "regression" and st.recovered_at is None and \
                    CONFIRM_POINTS <= held <= CONFIRM_WINDOW:
                out[key] = st
                break
    return out


def apply_steps(report: Any, steps: dict[tuple[str, str, str], Step]) -> int:
    """Turn the verdicts of `report` (harness.records.compare.Report) whose series shows
    a confirmed step into regressions naming the step; returns how many changed."""
    changed = 0
    for v in report.verdicts:
        st = steps.get((v.variant, v.pass_name, v.case_id))
        if st is None or v.verdict in ("regression", "correctness_regression"):
            continue
        v.detail["step"] = st.to_dict()
        v.detail["reason"] = (f"a step of {st.ratio - 1:+.1%} across commits "
                              f"{st.last_good[:12]}..{st.first_bad[:12]}, confirmed by this "
                              f"commit (was: {v.verdict})")
        v.verdict = "regression"
        v.ratio = st.ratio
        changed += 1
    return changed
