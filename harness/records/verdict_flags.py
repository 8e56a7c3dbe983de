"""The per-case flags of one run and the bars shown with them (harness.records.verdict_stats,
4. and 5.): Benjamini-Hochberg over the owned cases, the large-change rule, and the cases of
a candidate found slower as a whole."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scipy import stats

from harness.records.noise import Key
from harness.records.verdict_history import Spread, diff_scale
from harness.records.verdict_types import (
    CASE_Q,
    CASE_TAIL_DF,
    LARGE_CHANGE,
    LARGE_K,
    MIN_CHANGE,
    OPEN_ALPHA,
    PROTECTED_ALPHA,
    CaseChange,
    RunDecision,
)


def bar(spread: Spread, n_base: int, alpha: float, tail_df: float, runs: int = 1) -> float:
    """The smallest slowdown whose one-sided p is below `alpha` (and MIN_CHANGE)."""
    t = float(stats.t.isf(alpha, min(spread.df, tail_df)))
    return max(MIN_CHANGE, math.expm1(t * spread.value * diff_scale(runs, n_base)))


def _casebar(c: CaseChange, m: int) -> float:
    """The smallest slowdown of this case alone that flags it: the first step of the
    Benjamini-Hochberg procedure over `m` cases, or the large-change rule."""
    bh = bar(c.spread, c.n_base, CASE_Q / max(m, 1), CASE_TAIL_DF, c.runs)
    if not c.one_chip:
        return bh
    return min(bh, max(LARGE_CHANGE, math.expm1(LARGE_K * c.spread.value
                                                * diff_scale(c.runs, c.n_base))))


def _bh(ps: list[float], q: float) -> list[bool]:
    if not ps:
        return []
    adj = stats.false_discovery_control(ps, method="bh")
    return [bool(a <= q) for a in adj]


def _large(c: CaseChange, sign: float) -> bool:
    """A change beyond any real excursion of one chip's runs (module doc, 5.), in the
    direction `sign`. Across chips there is no such bound: a chip of the same model ran
    a committed case 27% slower."""
    return c.one_chip and sign * c.d >= math.log1p(LARGE_CHANGE) and \
        sign * c.spread.t(c.d, c.n_base, c.runs) >= LARGE_K


def flag(out: RunDecision, verdicts: Sequence[Any]) -> None:
    by_key = {(v.variant, v.pass_name, v.case_id): v for v in verdicts}
    up_flag: set[Key] = set()
    down_flag: set[Key] = set()
    for yard in (False, True):
        fam = [c for c in out.cases.values() if c.yardstick == yard]
        up_flag |= {c.key for c, ok in zip(fam, _bh([c.p_up for c in fam], CASE_Q),
                                           strict=True)
                    if (ok and c.d >= math.log1p(MIN_CHANGE)) or _large(c, 1.0)}
        down_flag |= {c.key for c, ok in zip(fam, _bh([c.p_down for c in fam], CASE_Q),
                                             strict=True)
                      if (ok and c.d <= -math.log1p(MIN_CHANGE)) or _large(c, -1.0)}
    whole = {(c.variant, c.pass_name): c for c in out.candidates if c.verdict == "regression"}
    for g in whole:
        cs = [c for c in out.cases.values() if c.key[:2] == g]
        hit = [c.key for c in cs if c.p_up < PROTECTED_ALPHA and c.d >= math.log1p(MIN_CHANGE)]
        up_flag |= set(hit or [min(cs, key=lambda c: c.p_up).key])
    for key, c in out.cases.items():
        v = by_key[key]
        ratio = math.exp(c.d)
        for k in ("reason", "history", "rules"):
            v.detail.pop(k, None)
        m = sum(1 for o in out.cases.values() if o.yardstick == c.yardstick)
        v.detail.update(run_to_run_spread=c.spread.value, spread_df=round(c.spread.df, 2),
                        spread_pairs=c.spread.pairs, base_window_runs=c.n_base,
                        runs=c.runs,
                        window_ratio=ratio, p_slower=c.p_up, p_faster=c.p_down,
                        threshold=_casebar(c, m))
        if c.spread.prior is not None:
            v.detail["spread_prior"] = c.spread.prior
        v.ratio = ratio
        v.p_value = min(c.p_up, c.p_down)
        if key in up_flag:
            v.verdict = "regression"
            cand = whole.get(key[:2])
            if cand is not None:
                v.detail["candidate"] = cand.to_dict()
        elif key in down_flag:
            v.verdict = "improvement"
        elif abs(c.d) >= math.log1p(MIN_CHANGE) and min(c.p_up, c.p_down) < OPEN_ALPHA:
            v.verdict = "inconclusive"
            v.detail["reason"] = (f"{ratio - 1:+.2%} against runs spread {c.spread.value:.2%}"
                                  f" (p = {v.p_value:.2g}), not significant once the run's "
                                  f"{len(out.cases)} comparisons are counted")
        else:
            v.verdict = "same"
            v.detail["reason"] = (f"within the run-to-run noise: {ratio - 1:+.2%} against "
                                  f"runs spread {c.spread.value:.2%} (p = {v.p_value:.2g})")
