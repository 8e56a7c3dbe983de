"""A confirmed candidate against its parent commit's code timed by the same gate run, on
the same GPU, in the same minutes: what decides a commit wherever the gate could time its
parent's code (harness.records.verdict_stats, 7.), and the only thing that can where its
history ran on other chips.

Across chips the history cannot tell a 2% slowdown from the chip's offset: chips of one
model run a candidate several percent apart (a case 27-57% slower on one chip), so the
candidate test there reads a spread of several percent at 1.5 degrees of freedom and a
2% slowdown is never red at its commit (docs/regressions.md). But the gate's
confirmation runs (harness.records.confirm) time the commit's code again in fresh
children (`confirm_ms`) and, in the team's repository, its parent's code as often,
interleaved (`parent_ms`), all on the runner's own chip: the chip's offset is on both
sides of that comparison, and only one chip's run-to-run noise is left.

The test, per candidate-pass: every confirmation round times all its timed cases, so
run j has a level, the mean over the cases of their ln medians (a_j of the commit's
runs, its first timing and the confirmations; b_j of the parent's). Whatever a run's
cases share (the level drawn when its child and buffers were set up) stays in a_j. The
change is mean(a) - mean(b); its spread the pooled standard deviation of the a_j and b_j
about their own means, times sqrt(1/k_a + 1/k_b), read against Student's t with
k_a + k_b - 2 degrees of freedom: the two-sample t test with a pooled variance (Student
1908; as scipy.stats.ttest_ind, which the tests check it against). Where the history
knows the candidate's one-chip run-to-run spread of that mean (consecutive runs on one
chip), the pooled variance is moderated toward it (Smyth 2004, as
harness.records.verdict_stats, 2.), the prior worth `PRIOR_DF` degrees of freedom.

The screen that chose the suspect read its first run, which is in a_j: the test is
still at its level, as the event "screened and rejected" lies inside "rejected"
(harness.records.confirm). The parent's timings count only where the gate checked they
timed the baseline's source (harness.runs.gate_confirm).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from harness.records.verdict_history import PRIOR_DF, Spread

MIN_RUNS = 3  # runs needed on each side (so at least 4 degrees of freedom)


def run_levels(per_case: Sequence[Sequence[float]]) -> list[float]:
    """The level of each run: the mean over the cases of their ln medians at run j, for
    the runs every case has (a round times all the cases it times)."""
    k = min((len(xs) for xs in per_case), default=0)
    if not per_case or k == 0:
        return []
    return [statistics.fmean(xs[j] for xs in per_case) for j in range(k)]


def pooled(a: Sequence[float], b: Sequence[float], prior: float | None = None
           ) -> Spread | None:
    """One run's spread from the runs of both sides about their own means (module doc),
    moderated toward `prior` where given; None with fewer than `MIN_RUNS` a side."""
    if len(a) < MIN_RUNS or len(b) < MIN_RUNS:
        return None
    df = len(a) + len(b) - 2
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    var = (sum((x - ma) ** 2 for x in a) + sum((x - mb) ** 2 for x in b)) / df
    if prior is not None and math.isfinite(prior) and prior > 0:
        var = (PRIOR_DF * prior ** 2 + df * var) / (PRIOR_DF + df)
        return Spread(math.sqrt(var), PRIOR_DF + df, len(a) + len(b), prior)
    if var <= 0:
        return None  # identical timings: no spread to read a change against
    return Spread(math.sqrt(var), float(df), len(a) + len(b), None)


def change(new: Sequence[Sequence[float]], parent: Sequence[Sequence[float]],
           prior: float | None = None) -> tuple[float, Spread, int, int] | None:
    """The candidate's change against its parent's code on this runner: (mean(a) -
    mean(b), the pooled spread, k_a, k_b), or None where either side has too few runs.
    `new` and `parent`: per case, the ln medians of its runs. The p-value is
    `spread.p_up(d, k_b, runs=k_a)` (the difference of a mean of k_a runs and one of
    k_b)."""
    a, b = run_levels(new), run_levels(parent)
    spread = pooled(a, b, prior)
    if spread is None:
        return None
    return statistics.fmean(a) - statistics.fmean(b), spread, len(a), len(b)
