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
  The penalty is `PENALTY_K * sigma * log(n)`: the BIC's (a change point adds two
  parameters, its place and its level: log(n) of log likelihood) for Laplace noise of
  scale sigma (a Laplace fit to the committed H200 residuals of series spread 0.5-1.5%
  gives 0.9 spreads), where sigma is the run-to-run spread of the series itself
  (harness.records.noise.relative_spread: robust to the steps), floored at
  `SIGMA_FLOOR` (a series measured to 0.1% still moves by that much between runs).
  Twice that penalty left 1.5% of the 2% steps of such series without a cut near them
  (0.4% now), for a quarter of the false alerts (`bench/detection_steps.py`: 0.01% and
  0.05% per commit in the bands 0.5-1.5% and > 1.5%, against 0.04% and 0.19%).
- A change point is kept when its step (the difference of the medians of up to `WINDOW`
  commits on either side, not reaching back past the previous step kept) is at least
  `MIN_STEP` and `STEP_K` sigma, and the Mann-Whitney U test between those two windows
  gives p <= `ALPHA`. The windows' medians and the U test carry the evidence, so the
  step need only reach one spread: 30 commits estimate a series' spread to about 30%,
  and a bar of 1.5 spreads rejected 2% of those 2% steps where the estimate came out
  high, while the false alerts per commit hardly move (0.03% and 0.14% with it).
- Its commit range, from the posterior of where the step began: each point's
  likelihood under the level before and the level after (Student t, `NOISE_DF` degrees
  of freedom, scale `NOISE_SCALE` sigma: the fit of the committed residuals, in spreads,
  whose heavy tail makes one slow run weak evidence either way). The prior: where the
  gate knows the candidate's source hash per commit (`history_from_db`), a commit that
  changed it is where a step begins, one that did not `UNCHANGED_PRIOR` times as likely
  (a runner, driver or harness change still moves timings, and clear runs still place
  such a step); else flat over the windows. In the project's H200 history 30% of the
  commits changed a candidate's source; with that rate `bench/detection_steps.py
  --source-changes 0.3` names more steps within 2 commits, in narrower ranges. The
  first bad commit is the one most likely to lie at most `RANGE` commits after where
  the step began, less `RANGE_COST` per commit it lies after it (so that a
  sharp step names its own commit): a commit that is bad, and near the culprit. The last
  good commit is the last one before the step with probability (1 + `CREDIBLE`) / 2. One
  commit apart for a sharp step; around a slow run just before it, or a step spread over
  several commits, the range holds the commits the runs cannot tell apart. Naming the
  posterior's most likely commit, or the first of two points in a row nearer the new
  level, named 12-15% of the 2% steps of series spread 0.5-1.5% one or more commits
  early (the point before the step was a slow run); this rule names 3.5% early, about as
  many as it does knowing both levels exactly, for ranges of 2.7 commits on average.
- A later step back to within `RECOVER_K` sigma of the level before marks it recovered.
- A candidate's series too (`candidate_series`): per commit, the geometric mean over its
  cases of each case's level. A change to the kernel moves every case; the noise of
  different cases is nearly independent, so a 2% step that one case's 1% noise hides half
  the time stands out in the mean (`bench/detection_steps.py --per-candidate`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from harness.records.noise import relative_spread

MIN_STEP = 0.01
STEP_K = 1.0
RECOVER_K = 1.5  # a later step back to within this many sigma of before: recovered
SIGMA_FLOOR = 0.001
PENALTY_K = 1.0
MIN_POINTS = 4
ALPHA = 0.02  # Mann-Whitney U between the WINDOW points on either side of a change
WINDOW = 15
SERIES_RUNS = 30
NOISE_DF = 2.0  # the run-to-run noise: Student t (scipy.stats.t.fit of the committed H200
NOISE_SCALE = 0.7  # residuals in spreads: 1.6 degrees of freedom pooled, scale 0.7)
CREDIBLE = 0.9  # the last good commit: before the step with probability 0.95
RANGE = 2  # the first bad commit: at most this many commits after where it began ...
RANGE_COST = 0.01  # ... less this per commit it lies after it (module doc)
UNCHANGED_PRIOR = 0.05  # prior odds of a step at a commit that left the source as it was
ALL_CASES = "*"  # the case of a candidate's series: the mean over its cases
# Cases timed at a commit for it to count in that mean: two, so that a candidate the gate
# times on two cases (the floor of the teaching kernels) has a mean too; its noise is
# what the search's own spread measures.
MIN_CASES = 2


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
               min_step: float = MIN_STEP,
               rejected: list[tuple[int, str]] | None = None,
               changed: Sequence[bool] | None = None, tail: int = 0) -> list[Step]:
    """The steps of one commit-ordered series of medians (module doc), oldest first.
    `rejected`, if given, receives (index, rule) for each change point not kept.
    `changed`, if given, says per commit whether the candidate's source differs from the
    previous commit's: the prior of where a step began (module doc). `tail`: a change
    point whose new level is the series' last `tail` points or fewer is not put to the U
    test, whose smallest p for 2 points against 15 is 0.015, above ALPHA once one earlier
    point lies above them; the caller weighs such a step itself (the gate:
    harness.records.step_gate._held_enough)."""
    import numpy as np
    import ruptures

    if changed is not None and len(changed) != len(commits):
        raise ValueError(f"{len(changed)} source flags for {len(commits)} commits")
    flags = list(changed) if changed is not None else [True] * len(commits)
    kept = [i for i, m in enumerate(medians) if m is not None and m > 0 and math.isfinite(m)]
    pts = [(commits[i], medians[i]) for i in kept]
    # A source change at a commit whose run was left out still counts at the next one.
    prior = [any(flags[j] for j in range((kept[n - 1] + 1) if n else 0, i + 1))
             for n, i in enumerate(kept)]
    if len(pts) < MIN_POINTS:
        return []
    names = [c for c, _ in pts]
    xs = [math.log(m) for _, m in pts]
    sigma = max(relative_spread([m for _, m in pts]) or 0.0, SIGMA_FLOOR)
    pen = PENALTY_K * sigma * math.log(len(xs))
    algo = ruptures.Pelt(model="l1", min_size=2, jump=1).fit(np.asarray(xs)[:, None])
    bkps = algo.predict(pen=pen)
    steps: list[Step] = []
    levels: list[tuple[int, float, float]] = []  # (index, level before, level after)
    prev = 0
    for b in bkps[:-1]:
        # The level on either side: up to WINDOW points, not reaching back past the
        # previous step kept (PELT may cut a heavy-tailed pair of runs off as a segment
        # of its own; the windows look through such cuts).
        left, right = xs[max(prev, b - WINDOW):b], xs[b:b + WINDOW]
        before = statistics.median(left) if len(left) >= 2 else 0.0
        after = statistics.median(right) if len(right) >= 2 else 0.0
        delta = after - before
        rule = ("too few points" if len(left) < 2 or len(right) < 2
                else f"below {min_step:.0%}" if abs(delta) < math.log1p(min_step)
                else f"below {STEP_K:g} spread" if abs(delta) < STEP_K * sigma
                else "U test" if len(xs) - b > tail and _p_value(left, right) > ALPHA
                else "")
        if rule:  # within the noise, or a short excursion of heavy-tailed noise
            if rejected is not None:
                rejected.append((b, rule))
            continue
        lo, hi = _bracket(xs, max(prev, b - WINDOW), min(len(xs), b + WINDOW),
                          before, after, sigma, prior)
        steps.append(Step(index=b, last_good=names[lo], first_bad=names[hi],
                          ratio=math.exp(delta), sigma=sigma))
        levels.append((b, before, after))
        prev = b
    # A step undone later: a later step that brings the level back to before it.
    tol = RECOVER_K * sigma
    for st, (b, before, _after) in zip(steps, levels, strict=True):
        for later, (b2, _before2, after2) in zip(steps, levels, strict=True):
            if b2 > b and abs(after2 - before) <= tol:
                st.recovered_at = later.first_bad
                break
    return steps


def _bracket(xs: Sequence[float], start: int, end: int, before: float, after: float,
             sigma: float, changed: Sequence[bool]) -> tuple[int, int]:
    """(last good, first bad) indices of a step from `before` to `after` among
    xs[start:end] (module doc)."""
    import numpy as np
    from scipy import stats
    from scipy.special import logsumexp

    x = np.asarray(xs[start:end])
    scale = NOISE_SCALE * sigma
    # log p(x_i | before) - log p(x_i | after): the step beginning at c (its first point,
    # start < c < end) has log likelihood sum(d[:c - start]) + a constant.
    d = (stats.t.logpdf(x, NOISE_DF, loc=before, scale=scale)
         - stats.t.logpdf(x, NOISE_DF, loc=after, scale=scale))
    ll = np.cumsum(d)[:-1]
    # The prior: a commit that changed the candidate's source is where steps begin; one
    # that did not is UNCHANGED_PRIOR times as likely (the runner, driver or harness).
    ll = ll + np.where(np.asarray(changed[start + 1:end], dtype=bool), 0.0,
                       math.log(UNCHANGED_PRIOR))
    post = np.exp(ll - logsumexp(ll))  # P(it began at start + 1 + j)
    cdf = np.cumsum(post)
    # For each candidate f: P(f - RANGE <= began <= f), and E[f - began; began <= f].
    lag = np.concatenate([np.zeros(RANGE + 1), cdf])[:len(cdf)]
    j = np.arange(len(cdf))
    late = j * cdf - np.cumsum(j * post)
    first_bad = start + 1 + int(np.argmax(cdf - lag - RANGE_COST * late))
    last_good = start + int(np.searchsorted(cdf, (1.0 - CREDIBLE) / 2.0, side="right"))
    return min(last_good, first_bad - 1), first_bad


# ---------------------------------------------------------------- the gate's use


Series = dict[tuple[str, str, str], list[tuple[str, float]]]
Sources = dict[tuple[str, str], dict[str, str]]


def source_changes(commits: Sequence[str], sources: dict[str, str] | None) -> list[bool] | None:
    """Per commit of a series, whether the candidate's source hash differs from the
    previous commit's (True where either is unknown: no evidence either way); None
    without sources."""
    if sources is None:
        return None
    hashes = [sources.get(c, "") for c in commits]
    return [i == 0 or not a or not b or a != b
            for i, (a, b) in enumerate(zip([""] + hashes[:-1], hashes, strict=True))]


def candidate_series(series: Series, min_cases: int = MIN_CASES,
                     newest: str | None = None) -> Series:
    """(candidate, pass, ALL_CASES) -> [(commit, level)]: per commit, the geometric mean
    over the candidate's cases (at least `min_cases` of them timed at that commit) of
    each case's median over its own series' median. A change to a kernel moves all its
    cases at once, while most of the run-to-run noise does not (the residuals of two
    cases of one run are correlated about 0.1-0.2), so the mean of its cases is far
    quieter than any one of them: `bench/detection_steps.py --per-candidate`. The
    series ends at `newest` (the gate's commit) if given, else at the commit that most
    cases end at."""
    groups: dict[tuple[str, str], dict[str, list[float]]] = {}
    after: dict[tuple[str, str], dict[str, set[str]]] = {}
    for (name, pass_name, _case), pts in series.items():
        if len(pts) < MIN_POINTS:
            continue
        logs = [math.log(m) for _, m in pts]
        mid = statistics.median(logs)
        per_commit = groups.setdefault((name, pass_name), {})
        edges = after.setdefault((name, pass_name), {})
        for (commit, _), x in zip(pts, logs, strict=True):
            per_commit.setdefault(commit, []).append(x - mid)
        for (a, _), (b, _) in zip(pts, pts[1:], strict=False):
            edges.setdefault(b, set()).add(a)  # every series is in commit order
    out = {}
    for key, per_commit in groups.items():
        order = _newest_chain(after[key], per_commit, newest)
        pts = [(c, math.exp(statistics.fmean(per_commit[c]))) for c in order
               if c in per_commit and len(per_commit[c]) >= min_cases]
        if len(pts) >= MIN_POINTS:
            out[(*key, ALL_CASES)] = pts
    return out


def _newest_chain(before: dict[str, set[str]], seen: dict[str, list[float]],
                  newest: str | None) -> list[str]:
    """The commits whose order the series fix, oldest first, ending at `newest` (else
    the commit most series end at): from there back, each step to the latest of its
    predecessors (the one all the others precede). Where they are not ordered among themselves (cases of an old
    grid, then only those of a new one, say nothing of how their commits interleave) the
    chain stops, so a commit is never put where no series puts it."""
    ancestors: dict[str, set[str]] = {}

    def up(c: str) -> set[str]:
        if c not in ancestors:
            ancestors[c] = set()  # a cycle (series that disagree) ends here
            ancestors[c] = set().union(*(up(p) | {p} for p in before.get(c, ())))
        return ancestors[c]

    preceding = set().union(*before.values()) if before else set()
    sinks = [c for c in seen if c not in preceding]
    if newest is not None:
        sinks = [newest] if newest in sinks else []
    if not sinks:
        return []
    chain = [max(sinks, key=lambda c: (len(seen[c]), c))]
    while before.get(chain[-1]):
        preds = before[chain[-1]]
        latest = [p for p in preds if preds - {p} <= up(p)]
        if len(latest) != 1 or latest[0] in chain:
            break
        chain.append(latest[0])
    return chain[::-1]
