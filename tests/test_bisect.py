"""The bisection's search (harness.records.bisect.bisect_range) over simulated timings:
the culprit, the unclear commit timed again, skips, the bounds, the errors."""

from __future__ import annotations

import math
import random

import pytest

from harness.records.bisect import (
    BAD,
    END_RUNS,
    GOOD,
    MAX_SIZED_RUNS,
    SIZE_Z,
    SKIP,
    UNCLEAR,
    BisectError,
    bisect_range,
    classify,
    runs_needed,
    trimmed_mean,
)

CASES = {f"c{i}": 0.1 * (i + 1) for i in range(10)}


def commits(n: int) -> list[str]:
    return [f"{i:040x}" for i in range(n)]


def stepped(culprit: int, step: float = 0.05, calls: list[str] | None = None):
    """measure(commit): every case `step` slower from commit index `culprit` on."""
    def measure(commit: str) -> dict[str, float]:
        if calls is not None:
            calls.append(commit)
        slow = 1.0 + step if int(commit, 16) >= culprit else 1.0
        return {c: v * slow for c, v in CASES.items()}
    return measure


@pytest.mark.parametrize("n", [3, 4, 6, 9])
def test_every_culprit_of_a_noiseless_range_is_named(n):
    cs = commits(n)
    for culprit in range(1, n):
        res = bisect_range(cs, stepped(culprit))
        assert res.exact and res.culprit == cs[culprit], (n, culprit, res.reason)
        assert (res.last_good, res.first_bad) == (cs[culprit - 1], cs[culprit])
        # the two ends plus a binary search over the n - 2 commits between
        assert res.builds <= 2 + math.ceil(math.log2(n - 1)), res.builds
        assert all(t.verdict in (GOOD, BAD) for t in res.tested)
        assert res.step == pytest.approx(1.05)


def test_the_ends_are_timed_first_end_runs_times_each_then_only_commits_between():
    calls: list[str] = []
    cs = commits(5)
    res = bisect_range(cs, stepped(3, calls=calls))
    n = END_RUNS
    assert calls[:2 * n] == [cs[0]] * n + [cs[-1]] * n
    assert set(calls[2 * n:]) <= set(cs[1:-1])
    assert res.culprit == cs[3]
    # noiseless ends: no run shifts, so one timing a commit between is enough
    assert [t.commit for t in res.tested] == calls[2 * n:]


def test_the_timings_of_a_commit_between_are_sized_from_the_ends_runs():
    """Where whole runs shift, a commit between is timed as often as a step of that size
    needs (runs_needed), the same for a larger step on a quiet runner: one."""
    assert runs_needed(math.log(1.05), 0.0, 5, 5) == 1
    assert runs_needed(math.log(1.05), 0.001, 5, 5) == 1
    small = [runs_needed(math.log(1.02), sd, 5, 5) for sd in (0.001, 0.002, 0.003, 0.01)]
    assert small == sorted(small) and small[0] == 1 and small[-1] == MAX_SIZED_RUNS
    k = small[2]  # 0.3% shifts: the fewest runs putting each level SIZE_Z errors away
    assert k > 1
    se = 0.003 * math.sqrt(1 / k + 0.1)
    assert math.log(1.02) / 2 / se >= SIZE_Z > math.log(1.02) / 2 / (
        0.003 * math.sqrt(1 / (k - 1) + 0.1))

    rng = random.Random(4)
    calls: list[str] = []

    def shifting(commit: str) -> dict[str, float]:  # whole runs move by 0.5%
        calls.append(commit)
        lvl = 1.02 if int(commit, 16) >= 3 else 1.0
        shift = math.exp(rng.gauss(0.0, 0.005))
        return {c: v * lvl * shift for c, v in CASES.items()}

    cs = commits(6)
    res = bisect_range(cs, shifting)
    between = [c for c in calls[2 * END_RUNS:]]
    assert res.culprit == cs[3]
    assert all(between.count(c) >= 3 for c in set(between)), between
    fixed: list[str] = []
    bisect_range(cs, stepped(3, calls=fixed), min_runs=2)
    assert all(fixed[2 * END_RUNS:].count(c) >= 2 for c in set(fixed[2 * END_RUNS:]))


def test_given_levels_are_not_measured_again():
    calls: list[str] = []
    cs = commits(4)
    good = dict(CASES)
    bad = {c: v * 1.05 for c, v in CASES.items()}
    res = bisect_range(cs, stepped(2, calls=calls), good_level=good, bad_level=[bad, bad])
    assert res.culprit == cs[2]
    assert cs[0] not in calls and cs[-1] not in calls


def test_a_commit_halfway_between_the_levels_is_unclear_and_timed_again():
    cs = commits(3)
    seen: dict[str, int] = {}

    def measure(commit: str) -> dict[str, float]:
        seen[commit] = seen.get(commit, 0) + 1
        i = int(commit, 16)
        if i == 1 and seen[commit] == 1:  # its first run lands between the two levels
            return {c: v * 1.025 * (1 + 0.001 * (k % 3 - 1))
                    for k, (c, v) in enumerate(CASES.items())}
        return {c: v * (1.05 if i >= 1 else 1.0) for c, v in CASES.items()}

    res = bisect_range(cs, measure)
    assert [t.verdict for t in res.tested] == [UNCLEAR, BAD]
    assert res.culprit == cs[1] and seen[cs[1]] == 2
    assert res.builds == 3  # timing the same commit again is not another build


def test_after_its_repeats_the_nearer_level_decides():
    cs = commits(3)

    def measure(commit: str) -> dict[str, float]:
        i = int(commit, 16)
        f = {0: 1.0, 1: 1.024, 2: 1.05}[i]  # a little nearer good on every run
        wobble = 0.005 if i == 1 else 0.0  # the ends are quiet, the commit is not
        return {c: v * f * (1 + wobble * (k % 5 - 2)) for k, (c, v) in enumerate(CASES.items())}

    res = bisect_range(cs, measure, max_repeats=2)
    assert [t.verdict for t in res.tested] == [UNCLEAR, GOOD]
    assert res.culprit == cs[2]


def test_a_commit_that_cannot_be_measured_is_skipped_for_its_neighbour():
    cs = commits(6)
    base = stepped(4)

    def measure(commit: str) -> dict[str, float]:
        return {} if int(commit, 16) == 2 else base(commit)  # the middle does not build

    res = bisect_range(cs, measure)
    assert res.tested[0].commit == cs[2] and res.tested[0].verdict == SKIP
    assert res.tested[1].commit in (cs[1], cs[3])
    assert res.culprit == cs[4] and res.exact


def test_a_culprit_that_cannot_be_measured_leaves_the_range_around_it():
    cs = commits(4)
    base = stepped(2)

    def measure(commit: str) -> dict[str, float]:
        return {} if int(commit, 16) == 2 else base(commit)

    res = bisect_range(cs, measure)
    assert not res.exact and res.culprit is None
    assert (res.last_good, res.first_bad) == (cs[1], cs[3])
    assert "could not be measured" in res.reason


def test_max_builds_bounds_the_distinct_commits_built():
    calls: list[str] = []
    cs = commits(9)
    res = bisect_range(cs, stepped(5, calls=calls), max_builds=3)
    assert res.builds == 3 and len(set(calls)) == 3
    assert not res.exact and "--max-builds 3" in res.reason
    # what it learnt still narrows the range
    assert cs.index(res.last_good) < 5 <= cs.index(res.first_bad)
    assert cs.index(res.first_bad) - cs.index(res.last_good) < 8


def test_max_seconds_stops_before_a_measurement_that_would_pass_it():
    now = [0.0]

    def clock() -> float:
        return now[0]

    base = stepped(6)

    def measure(commit: str) -> dict[str, float]:
        now[0] += 60.0  # every timing takes a minute
        return base(commit)

    res = bisect_range(commits(9), measure, max_seconds=7.5 * 60, clock=clock)
    assert now[0] <= 7.5 * 60
    assert not res.exact and "--max-minutes 7.5" in res.reason


def test_a_range_without_a_commit_between_names_the_bad_end():
    cs = commits(2)
    res = bisect_range(cs, stepped(1))
    assert res.exact and res.culprit == cs[1] and res.tested == []


def test_errors():
    with pytest.raises(BisectError, match="last good and its first bad"):
        bisect_range(commits(1), stepped(1))
    with pytest.raises(BisectError, match="twice"):
        bisect_range(["a" * 40, "a" * 40], stepped(1))
    with pytest.raises(BisectError, match="could not be measured"):
        bisect_range(commits(3), lambda _c: {})
    with pytest.raises(BisectError, match="fewer than 3 cases"):
        bisect_range(commits(3), lambda _c: {"x": 1.0})


def test_one_wild_case_does_not_decide():
    """The trimmed mean: one case 30% off (a heavy-tailed run) does not move a good
    commit to the bad side of a 2% step."""
    good = [dict(CASES)]
    bad = [{c: v * 1.02 for c, v in CASES.items()}]
    run = dict(CASES, c0=CASES["c0"] * 1.3)
    got = classify([run], good, bad, decide=True)
    assert got is not None and got.verdict == GOOD
    assert trimmed_mean([0.0] * 9 + [0.3]) == 0.0


def test_noisy_steps_are_named_exactly_most_of_the_time():
    """2% steps, 1% per-case spread of t2 noise, 12 cases: the benchmark's middle band
    (bench/bisect_exactness.py) on a few alerts."""
    rng = random.Random(5)
    scale = 0.01 / (1.4826 * math.sqrt(2.0 / 3.0))
    exact = 0
    for _ in range(60):
        n = rng.randint(3, 9)
        culprit = rng.randint(1, n - 1)
        levels = {f"k{j}": math.exp(rng.uniform(-3, 1.5)) for j in range(12)}

        def measure(commit: str, culprit=culprit, levels=levels) -> dict[str, float]:
            slow = 1.02 if int(commit, 16) >= culprit else 1.0
            return {c: v * slow * math.exp(scale * rng.gauss(0, 1)
                                           / math.sqrt(rng.expovariate(1.0)))
                    for c, v in levels.items()}

        res = bisect_range(commits(n), measure)
        exact += res.culprit == commits(n)[culprit]
    assert exact >= 55, exact


def test_min_runs_times_each_commit_between_that_often_before_a_verdict():
    calls: list[str] = []
    cs = commits(6)
    res = bisect_range(cs, stepped(3, calls=calls), min_runs=2, end_runs=1)
    between = [c for c in calls if c not in (cs[0], cs[-1])]
    assert res.culprit == cs[3]
    assert all(between.count(c) == 2 for c in set(between))
    assert len(res.tested) == len(set(between))  # one verdict per commit, after 2 runs
