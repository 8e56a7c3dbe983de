"""The culprit of a ranged alert: a binary search over the commits of its range.

A step found across commits (harness.records.steps) names a last good and a first bad
commit; between them lie the commits no gate timed, or whose runs could not tell the two
levels apart. `bisect_range` times commits of that range and names the first bad one.
It is a pure function over `measure(commit) -> {case id: median ms}`: the command line
(harness.runs.bisect_run) builds each commit in a git worktree and times it with the
gate's method; tests and `bench/bisect_exactness.py` pass simulated timings.

The method:

1. **The two levels.** The last good and the first bad commit are measured first, by
   the same `measure`, `END_RUNS` times each (unless their levels are given): a
   bisection days after the alert runs on a runner whose level may have moved since (a
   driver, the chip), and only levels measured now, on the same runner, tell a commit's
   level apart from that drift. Every commit is classified against these two levels,
   so their noise is in every verdict: with one run each, 2% steps at 1.5% per-case
   spread were named exactly 91.5% of the time, with three 97.5% (the benchmark below).
2. **Binary search.** The middle untested commit of the open range is measured and
   classified good or bad; the range halves. A commit that cannot be measured (it does
   not build, a case fails) is `skip`ped and its nearest untested neighbour is tried
   instead, as `git bisect skip` does.
3. **Classification.** Per case, the commit's log median minus the midpoint of the two
   levels' log medians, signed so that positive is towards the bad level; over the
   cases, the trimmed mean of those (`TRIM` of either tail dropped: the run-to-run noise
   of one case is heavy tailed, Student t with about 2 degrees of freedom on the project's
   H200 and H100 histories, and one case 10% off must not decide a 2% step). The commit
   is bad when that mean is above 0, good below, and `unclear` when it lies within `Z`
   standard errors of 0: it is timed once more, its medians pooled with the earlier
   ones (per case, the median of its runs), up to `MAX_REPEATS` times; then the nearer
   level decides. The standard error is the larger of the spread of the per-case values
   over the cases (robust) over the square root of their number, and what a shift of a
   whole run (every case at once, which that spread cannot see) does to the commit's
   runs and both levels: `run_spread`, from the repeated runs of the ends. A commit is
   timed `min_runs` times before its first classification; by default as many as the
   ends' runs say it needs (`runs_needed`): on a runner whose runs shift as a whole
   (the project's records: a shift of about 0.4 times the per-case spread, heavy
   tailed), one timing of a commit cannot tell a 2% step's levels apart, and its median
   over several can; on a quiet one a single timing stays enough. The
   ratio reported is the trimmed geometric mean over the cases of the commit's median
   over the good level's.
4. **Pooling.** A commit classified good joins the good level (per case, the median over
   the good level's runs), one classified bad the bad level: later classifications of the
   same search stand on more runs.
5. **Bounds.** At most `max_builds` distinct commits are measured (the two ends count),
   and no measurement starts once `max_seconds` are spent or would be by the time it ends
   (the mean duration of the measurements so far). A search stopped by either names the
   range it narrowed to and says why; `exact` is true only when one commit is left.

`bench/bisect_exactness.py` simulates ranged alerts (2-8 commits, 2% and 5% steps,
per-case noise Student t with 2 degrees of freedom at spreads of 0.5-1.5%, 8-16 cases)
and prints the fraction for which the culprit named is the true first bad commit
(docs/regressions.md, "Bisecting a ranged alert").
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

Level = Mapping[str, float]  # case id -> median ms
Measure = Callable[[str], Level]

TRIM = 0.2  # of either tail of the per-case values (module doc, 3)
Z = 2.0  # standard errors from the midpoint within which a commit is unclear
MAX_REPEATS = 3  # measurements of one commit before the nearer level decides
END_RUNS = 5  # measurements of each end when its level is not given
MIN_RUNS = 1  # measurements of a commit between before it is classified (the fewest)
# Measurements of a commit between when not given (`runs_needed`): up to this many, so
# that a commit at either level lies `SIZE_Z` standard errors of a whole run's shift from
# the midpoint.
MAX_SIZED_RUNS = 5
SIZE_Z = 3.5
MIN_CASES = 3  # cases measured at the commit and both levels for a classification
DEFAULT_MAX_BUILDS = 10

GOOD, BAD, UNCLEAR, SKIP = "good", "bad", "unclear", "skip"


class BisectError(ValueError):
    """Input that cannot be bisected (too few commits, levels without common cases)."""


@dataclass(frozen=True)
class Tested:
    """One measurement of one commit and what it said."""

    commit: str
    verdict: str  # good, bad, unclear (timed again), skip (not measurable)
    ratio: float | None  # trimmed geometric mean over the cases of median / good level
    position: float | None = None  # 0 at the good level, 1 at the bad level
    note: str = ""

    def line(self) -> str:
        r = f" {self.ratio - 1:+.2%} against good" if self.ratio else ""
        p = f", at {self.position:.2f} of the step" if self.position is not None else ""
        return f"{self.commit[:12]} {self.verdict}{r}{p}" + (f" ({self.note})" if self.note
                                                              else "")


@dataclass
class BisectResult:
    culprit: str | None  # the first bad commit, when the search ended on one
    last_good: str  # the range it narrowed to: last good ..
    first_bad: str  # .. first bad (== culprit when exact)
    tested: list[Tested] = field(default_factory=list)
    exact: bool = False
    reason: str = ""
    builds: int = 0  # distinct commits measured
    step: float | None = None  # bad level / good level (trimmed geometric mean)

    def as_tuples(self) -> list[tuple[str, str, float | None]]:
        return [(t.commit, t.verdict, t.ratio) for t in self.tested]


def trimmed_mean(xs: Sequence[float], trim: float | None = None) -> float:
    s = sorted(xs)
    k = int(len(s) * (TRIM if trim is None else trim))
    return statistics.fmean(s[k:len(s) - k] if len(s) > 2 * k else s)


def _robust_sd(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    mid = statistics.median(xs)
    return 1.4826 * statistics.median(abs(x - mid) for x in xs)


def _logs(runs: Sequence[Level]) -> dict[str, float]:
    """Per case, the median over `runs` of its log median (cases of every run only)."""
    common = set.intersection(*(set(r) for r in runs)) if runs else set()
    out = {}
    for c in common:
        vals = [r[c] for r in runs]
        if all(v is not None and v > 0 and math.isfinite(v) for v in vals):
            out[c] = statistics.median(math.log(v) for v in vals)
    return out


@dataclass
class Classified:
    verdict: str
    ratio: float
    position: float
    z: float


def run_spread(levels: Sequence[Sequence[Level]]) -> float:
    """The spread of one run's level as a whole: per group of runs of one commit (the
    ends), each run's trimmed mean over the cases of its log medians less the group's
    per-case medians; their pooled standard deviation. 0 with no group of two runs."""
    ss, df = 0.0, 0
    for runs in levels:
        mid = _logs(runs)
        if len(runs) < 2 or len(mid) < MIN_CASES:
            continue
        shifts = [trimmed_mean([math.log(r[c]) - mid[c] for c in mid]) for r in runs]
        mean = statistics.fmean(shifts)
        ss += sum((x - mean) ** 2 for x in shifts)
        df += len(shifts) - 1
    return math.sqrt(ss / df) if df else 0.0


def classify(runs: Sequence[Level], good: Sequence[Level], bad: Sequence[Level], *,
             z: float = Z, decide: bool = False, run_sd: float = 0.0) -> Classified | None:
    """Where a commit measured `runs` times lies between the two levels (module doc, 3);
    None when fewer than MIN_CASES cases are common to all. `decide`: no `unclear`, the
    nearer level wins. `run_sd` (`run_spread`): how much a run moves as a whole, which
    the spread over the cases cannot see; the standard error is the larger of the two."""
    m, g, b = _logs(runs), _logs(good), _logs(bad)
    cases = sorted(set(m) & set(g) & set(b))
    if len(cases) < MIN_CASES:
        return None
    step = trimmed_mean([b[c] - g[c] for c in cases])
    sign = 1.0 if step >= 0 else -1.0
    d = [sign * (m[c] - (g[c] + b[c]) / 2.0) for c in cases]
    mean = trimmed_mean(d)
    se = _robust_sd(d) / math.sqrt(len(d))
    # A whole run's shift moves the commit's runs and both levels' (the midpoint is
    # the mean of the two, each the median of its runs): its share of the variance.
    se = max(se, run_sd * math.sqrt(1 / len(runs) + 0.25 / len(good) + 0.25 / len(bad)))
    zval = mean / se if se > 0 else math.copysign(math.inf, mean)
    ratio = math.exp(trimmed_mean([m[c] - g[c] for c in cases]))
    position = 0.5 + sign * mean / step if step else 0.5
    verdict = UNCLEAR if not decide and abs(zval) < z else BAD if mean > 0 else GOOD
    return Classified(verdict, ratio, position, zval)


def runs_needed(step_log: float, run_sd: float, n_good: int, n_bad: int) -> int:
    """The timings of a commit between (MIN_RUNS to MAX_SIZED_RUNS) that put a commit at
    either level `SIZE_Z` standard errors of a whole run's shift (`run_sd`, the ends'
    `run_spread`) from the midpoint of a step of `step_log` (classify's standard error
    with `n_good` and `n_bad` runs at the levels)."""
    half = abs(step_log) / 2.0
    for k in range(MIN_RUNS, MAX_SIZED_RUNS + 1):
        se = run_sd * math.sqrt(1 / k + 0.25 / max(n_good, 1) + 0.25 / max(n_bad, 1))
        if se <= 0 or half / se >= SIZE_Z:
            return k
    return MAX_SIZED_RUNS


def bisect_range(commits: Sequence[str], measure: Measure, *,
                 good_level: Level | Sequence[Level] | None = None,
                 bad_level: Level | Sequence[Level] | None = None,
                 max_builds: int = DEFAULT_MAX_BUILDS, max_seconds: float | None = None,
                 max_repeats: int = MAX_REPEATS, z: float = Z, pool: bool = True,
                 end_runs: int = END_RUNS, min_runs: int | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] | None = None) -> BisectResult:
    """The first bad commit of `commits` (oldest first: the last good commit, the commits
    between, the first bad commit), by the method of the module doc. `good_level` and
    `bad_level` (one run's medians or several runs'): the ends' levels; None measures
    that end first (and counts it as a build). `measure` returns {case id: median ms};
    a case it leaves out or returns as None is not measured at that commit, an empty
    result makes the commit a `skip`. Raises BisectError when there is nothing to search
    or the ends cannot be measured."""
    commits = list(commits)
    if len(commits) < 2:
        raise BisectError("a range needs its last good and its first bad commit")
    if len(set(commits)) != len(commits):
        raise BisectError("a commit appears twice in the range")
    say = log or (lambda _line: None)
    start = clock()
    durations: list[float] = []
    runs: dict[str, list[Level]] = {}
    out = BisectResult(None, commits[0], commits[-1])

    def over_budget() -> str | None:
        if len(runs) >= max_builds and not all(c in runs for c in pending):
            return f"--max-builds {max_builds} reached"
        if max_seconds is not None and durations:
            spent = clock() - start
            if spent + statistics.fmean(durations) > max_seconds:
                return f"--max-minutes {max_seconds / 60:g} reached ({spent / 60:.1f} min spent)"
        return None

    def timed(commit: str) -> Level:
        t0 = clock()
        got = {c: v for c, v in (measure(commit) or {}).items()
               if v is not None and v > 0 and math.isfinite(v)}
        durations.append(clock() - t0)
        runs.setdefault(commit, []).append(got)
        return got

    def as_runs(level: Level | Sequence[Level] | None) -> list[Level] | None:
        if level is None:
            return None
        return [level] if isinstance(level, Mapping) else list(level)

    good, bad = as_runs(good_level), as_runs(bad_level)
    for name, end, given in (("last good", commits[0], good), ("first bad", commits[-1], bad)):
        if given is None:
            pending = [end]
            why = over_budget()
            if why:
                raise BisectError(f"{why} before the {name} commit {end[:12]} was measured")
            for r in range(end_runs):
                if r and over_budget():
                    break  # the time bound holds for the ends' repeats too
                if not timed(end):
                    raise BisectError(f"the {name} commit {end[:12]} could not be measured")
            say(f"{name} {end[:12]}: measured ({len(runs[end][-1])} case(s))")
    good = good or list(runs[commits[0]])
    bad = bad or list(runs[commits[-1]])
    spread = run_spread([good, bad])
    first = classify(bad, good, bad, decide=True)
    if first is None:
        raise BisectError(f"fewer than {MIN_CASES} cases measured at both ends")
    out.step = first.ratio
    say(f"step {first.ratio - 1:+.2%} from {commits[0][:12]} to {commits[-1][:12]}")
    if min_runs is None:
        min_runs = runs_needed(math.log(first.ratio), spread, len(good), len(bad))
        say(f"{min_runs} timing(s) a commit (whole runs shift {spread:.2%} at the ends)")
    max_repeats = max(max_repeats, min_runs + 1)  # one timing more after the first verdict
    lo, hi = 0, len(commits) - 1
    skipped: set[int] = set()
    pending: list[str] = []
    while hi - lo > 1:
        open_ = [i for i in range(lo + 1, hi) if i not in skipped]
        if not open_:
            out.reason = (f"every commit between {commits[lo][:12]} and {commits[hi][:12]} "
                          "could not be measured")
            break
        mid = (lo + hi) // 2
        i = min(open_, key=lambda j: (abs(j - mid), j))  # the middle, else its neighbour
        commit = commits[i]
        pending = [commit]
        verdict: Classified | None = None
        for n in range(max_repeats):
            why = over_budget()
            if why:
                out.reason = why
                break
            if not timed(commit):
                break
            if len(runs[commit]) < min_runs and n < max_repeats - 1:
                continue
            verdict = classify(runs[commit], good, bad, z=z, decide=n == max_repeats - 1,
                               run_sd=spread)
            if verdict is None:
                break
            out.tested.append(Tested(commit, verdict.verdict, verdict.ratio,
                                     verdict.position, note=f"z {verdict.z:+.1f}"))
            say(out.tested[-1].line())
            if verdict.verdict != UNCLEAR:
                break
        if out.reason:
            break
        if verdict is None or verdict.verdict == UNCLEAR:
            why = "no case measured" if verdict is None else "unclear"
            out.tested.append(Tested(commit, SKIP, None, note=why))
            say(out.tested[-1].line())
            skipped.add(i)
            continue
        if verdict.verdict == GOOD:
            lo = i
            if pool:
                good = good + runs[commit]
        else:
            hi = i
            if pool:
                bad = bad + runs[commit]
    out.builds = len(runs)
    out.last_good, out.first_bad = commits[lo], commits[hi]
    if hi - lo == 1:
        out.culprit, out.exact = commits[hi], True
        out.reason = out.reason or f"first bad commit {commits[hi][:12]}"
    elif not out.reason:
        out.reason = "the range could not be narrowed further"
    return out
