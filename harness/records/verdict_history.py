"""What the per-commit verdict (harness.records.verdict_stats) reads of the history: one
run's moderated run-to-run spread (module doc of verdict_stats, 2.), the baseline window a
change is taken against (1.), and a candidate's change over its cases with its A/A pairs
(3.).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats

from harness.records.noise import Key, NoiseModel

WINDOW = 5  # baseline runs at the same source whose mean a change is taken against
PRIOR_DF = 4.0  # degrees of freedom the prior spread is worth
MAD_EFFICIENCY = 0.37  # degrees of freedom per A/A pair of a robust (MAD) scale
# A candidate of fewer cases changes by its least-moved case (verdict_stats module doc, 3.): a Walsh
# median of two or three cases is their mean, which one case's heavy-tailed excursion
# moves (on one chip's series a 2-case candidate read 1.1% slower, p = 3e-5, from one
# case's noise), while a change to the kernel moves every case.
ROBUST_CASES = 4
MIN_COMMON = 2  # cases two runs must share for a candidate-level A/A pair


def log_median(m: Any) -> float | None:
    try:
        x = float(m)
    except (TypeError, ValueError):
        return None
    return math.log(x) if x > 0 and math.isfinite(x) else None


def robust_scale(diffs: Sequence[float]) -> float:
    """One run's spread from |differences| of A/A pairs (noise module's scale)."""
    return 1.4826 * statistics.median(abs(d) for d in diffs) / math.sqrt(2.0)


def walsh_median(xs: Sequence[float]) -> float:
    """The one-sample Hodges-Lehmann estimate: the median of all (x_i + x_j) / 2, i <= j."""
    return statistics.median((a + b) / 2.0 for i, a in enumerate(xs) for b in xs[i:])


@dataclass(frozen=True)
class Spread:
    """A moderated run-to-run spread (verdict_stats module doc, 2.): the value, its degrees of freedom,
    the pairs it saw and the prior it was shrunk toward."""

    value: float
    df: float
    pairs: int
    prior: float | None

    @staticmethod
    def moderate(pairs: Sequence[float], prior: float | None) -> Spread | None:
        nu = MAD_EFFICIENCY * len(pairs) if len(pairs) >= 2 else 0.0
        own = robust_scale(pairs) if nu else None
        if prior is None or not math.isfinite(prior) or prior <= 0:
            return Spread(own, nu, len(pairs), None) if own else None
        if own is None:
            return Spread(prior, PRIOR_DF, len(pairs), prior)
        var = (PRIOR_DF * prior ** 2 + nu * own ** 2) / (PRIOR_DF + nu)
        return Spread(math.sqrt(var), PRIOR_DF + nu, len(pairs), prior)

    def t(self, d: float, n_base: int, runs: int = 1) -> float:
        """d in spreads of a difference of means: `runs` runs of the new commit (its
        timing and the confirmations, harness.records.confirm) against `n_base`."""
        return d / (self.value * diff_scale(runs, n_base))

    def p_up(self, d: float, n_base: int, tail_df: float = math.inf, runs: int = 1) -> float:
        return float(stats.t.sf(self.t(d, n_base, runs), min(self.df, tail_df)))

    def p_down(self, d: float, n_base: int, tail_df: float = math.inf, runs: int = 1) -> float:
        return float(stats.t.cdf(self.t(d, n_base, runs), min(self.df, tail_df)))


def diff_scale(runs: int, n_base: int) -> float:
    """The spread of (mean of `runs` runs) - (mean of `n_base` runs) in one run's spreads:
    sqrt(1/runs + 1/n_base), the runs independent (each a fresh timing child: the level
    a run reads is drawn when its process and buffers are set up, docs/regressions.md)."""
    return math.sqrt(1.0 / max(runs, 1) + 1.0 / max(n_base, 1))


def parent_logs(entry: dict[str, Any]) -> list[float]:
    """The ln medians of the parent commit's code timed by the same run (`parent_ms`,
    harness.records.confirm), valid ones only."""
    more = entry.get("parent_ms") or []
    return [x for m in (more if isinstance(more, list) else [])
            if (x := log_median(m)) is not None]


def run_logs(entry: dict[str, Any]) -> list[float]:
    """The ln medians of one commit's runs of a case: the run's own median and the
    confirmation runs' (`confirm_ms`, harness.records.confirm), valid ones only."""
    first = log_median(entry.get("median_ms"))
    if first is None:
        return []
    more = entry.get("confirm_ms") or []
    return [first, *(x for m in (more if isinstance(more, list) else [])
                     if (x := log_median(m)) is not None)]


# ----------------------------------------------------------------- history reading


def history_points(noise: NoiseModel, key: Key) -> list[tuple[str, float, str, Any]]:
    runs = noise.runs.get(key) or [None] * len(noise.points.get(key, []))
    return [(src, x, dev, run) for (src, m, dev), run in zip(noise.points.get(key, []), runs,
                                                             strict=True)
            if (x := log_median(m)) is not None]


def window(noise: NoiseModel, key: Key, source: str, device: str,
           base: Sequence[dict[str, Any]] = ()) -> list[float]:
    """The ln medians of the last `WINDOW` runs at `source`, of `device` where it has any
    (verdict_stats module doc, 1.). `base`: the baseline's entries of the key, newest first; a history
    that does not end with the newest of them (the baseline is not in it) gives way to
    their medians."""
    pts = [(x, dev) for src, x, dev, _ in history_points(noise, key) if src == source]
    own = [x for x, dev in pts if device and dev == device]
    win = (own or [x for x, _ in pts])[-WINDOW:]
    first = log_median(base[0].get("median_ms")) if base else None
    if first is not None and not any(abs(x - first) < 1e-12 for x in win):
        return [x for e in base[:WINDOW] if (x := log_median(e.get("median_ms"))) is not None]
    return win


def candidate_change(ds: Sequence[float]) -> float:
    """A candidate's change from its cases' changes (verdict_stats module doc, 3.): the Walsh median of
    `ROBUST_CASES` or more; with fewer, the smallest (every case must have moved)."""
    return walsh_median(ds) if len(ds) >= ROBUST_CASES else min(ds)


def candidate_pairs(noise: NoiseModel, variant: str, pass_name: str,
                     across: bool | None,
                     stat: Callable[[Sequence[float]], float] | None = None) -> list[float]:
    """The candidate's change (`stat`, default `candidate_change`) between consecutive
    runs at one source over the cases both timed (A/A pairs of the candidate as a whole),
    of the kind `across` is."""
    runs: dict[Any, dict[str, tuple[float, str, str]]] = {}
    for key in noise.points:
        if key[0] != variant or key[1] != pass_name:
            continue
        for src, x, dev, run in history_points(noise, key):
            if run is not None:
                runs.setdefault(run, {})[key[2]] = (x, src, dev)
    # Run ids grow with the history (database ids, or the order rows were added in).
    ordered = [runs[r] for r in sorted(runs, key=lambda r: (isinstance(r, str), r))]
    out = []
    for a, b in zip(ordered, ordered[1:], strict=False):
        common = sorted(set(a) & set(b))
        if len(common) < MIN_COMMON:
            continue
        sa = {a[c][1] for c in common}
        if len(sa) != 1 or sa != {b[c][1] for c in common}:
            continue  # the code changed between them: not an A/A pair
        da = {a[c][2] for c in common}
        db = {b[c][2] for c in common}
        if across is not None and (len(da) != 1 or len(db) != 1 or "" in da or "" in db
                                   or (da != db) != across):
            continue
        out.append((stat or candidate_change)([b[c][0] - a[c][0] for c in common]))
    return out


def case_spreads(noise: NoiseModel, across: bool | None) -> dict[Key, list[float]]:
    return {k: noise.used(k, across) for k in noise.points}




def centred(pairs: list[float], cases: int) -> tuple[list[float], float]:
    """A/A pairs of a candidate's change about their centre: the smallest of a few cases'
    changes is below zero when nothing changed (the median of its A/A pairs); a Walsh
    median is centred at zero."""
    if cases >= ROBUST_CASES or len(pairs) < 2:
        return pairs, 0.0
    centre = statistics.median(pairs)
    return [p - centre for p in pairs], centre
