"""Statistics of timing samples, for `harness.records.compare`: the interval of a median,
the shift between two sample sets, and how far one run's level moved while it was timed
(rule 4 of the comparison; its reasons are in that module's doc)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np
from scipy import stats


def median_interval(samples: Sequence[float], conf: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: order statistics x_(l), x_(n+1-l)
    with l the binomial(n, 1/2) quantile of (1-conf)/2 (the sign-test interval)."""
    xs = sorted(samples)
    n = len(xs)
    if n == 0:
        raise ValueError("no samples")
    lo = int(stats.binom.ppf((1.0 - conf) / 2.0, n, 0.5))  # 1-based rank of the lower end
    lo = max(lo, 1)
    hi = n + 1 - lo
    return xs[lo - 1], xs[hi - 1]


LEVEL_BLOCKS = 4
LEVEL_ALPHA = 0.01  # the Kruskal-Wallis test that a run's blocks sit at one level


def level_range(samples: Sequence[float], min_block: int = 5) -> float | None:
    """How far one run's level moved while it was timed: ln(highest / lowest) of the
    medians of `LEVEL_BLOCKS` consecutive blocks of its samples in the order they were
    taken (the records keep that order; 2 blocks where there are too few for 4), when a
    Kruskal-Wallis test finds the blocks apart (p < `LEVEL_ALPHA`), else 0: blocks of
    independent draws around one level also have medians apart by chance, and holding a
    change to that range would throw away what rules 2 and 3 resolve (at 20 samples of
    1.5% noise, 3% slowdowns flagged 85% of the time instead of 96%,
    `bench/detection_power.py`). None with fewer than `min_block` samples a block."""
    xs = [float(x) for x in samples]
    k = LEVEL_BLOCKS if len(xs) >= LEVEL_BLOCKS * min_block else 2
    if len(xs) < k * min_block:
        return None
    blocks = [xs[i * len(xs) // k:(i + 1) * len(xs) // k] for i in range(k)]
    if len({x for b in blocks for x in b}) < 2 or \
            float(stats.kruskal(*blocks).pvalue) >= LEVEL_ALPHA:
        return 0.0
    meds = [statistics.median(b) for b in blocks]
    lo, hi = min(meds), max(meds)
    return math.log(hi / lo) if lo > 0 else None


def level_bar(base_runs: Sequence[Sequence[float]], new: Sequence[float],
              min_block: int = 5) -> float | None:
    """Rule 4's bar: the larger of the new run's `level_range` and the median of the base
    runs' (one restless run in a window of twenty gives a twentieth of its pooled
    samples); None when no run has enough samples."""
    base = [d for b in base_runs if (d := level_range(b, min_block)) is not None]
    both = [d for d in (statistics.median(base) if base else None,
                        level_range(new, min_block)) if d is not None]
    return max(both) if both else None


def hodges_lehmann_shift(base: Sequence[float], new: Sequence[float]) -> float:
    """Median of all pairwise differences new_i - base_j (the shift estimate that goes
    with the Mann-Whitney U test)."""
    diffs = np.subtract.outer(np.asarray(new, dtype=float), np.asarray(base, dtype=float))
    return float(np.median(diffs))
