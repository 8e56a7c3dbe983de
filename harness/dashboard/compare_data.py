"""What the Compare page reads beyond one run's results: the baseline a run was judged
against, and the per-variant summary of a pair of runs (plain functions; nothing here
imports Streamlit)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from sqlalchemy import Engine, String, cast, func, select

from harness.dashboard.queries import FLAGGED, GOOD
from harness.dashboard.schema import Comparison, Run

SUMMARY_COLUMNS = ["variant", "verdicts", "geomean ratio", "worst ratio", "worst case",
                   "pairs", "flagged"]


def default_base(engine: Engine, run_id: int) -> int | None:
    """The run `run_id` was judged against (the base run most of its stored verdicts on
    pairs both runs hold name), else the newest earlier run of the same GPU model and
    grids. A `missing` verdict names the run that holds a case this one lacks (a pooled
    baseline's run of the other dtype, say), a `new` one a base run that lacks the case
    (a gate run judged against an earlier run of another grid): no pair to compare, so
    neither counts."""
    with engine.connect() as conn:
        stored = conn.execute(
            select(Comparison.base_run_id, func.count().label("n"))
            .where(Comparison.run_id == run_id, Comparison.base_run_id.is_not(None),
                   Comparison.verdict.not_in(("missing", "new")))
            .group_by(Comparison.base_run_id).order_by(func.count().desc()).limit(1)).first()
        if stored is not None:
            return int(stored[0])
        me = conn.execute(select(Run.gpu_model_key, cast(Run.grids, String), Run.created_at)
                          .where(Run.id == run_id)).first()
        if me is None:
            return None
        prev = conn.execute(
            select(Run.id).where(Run.gpu_model_key == me[0], cast(Run.grids, String) == me[1],
                                 Run.created_at <= me[2], Run.id != run_id)
            .order_by(Run.created_at.desc(), Run.id.desc()).limit(1)).scalar()
    return None if prev is None else int(prev)


def per_variant(both: pd.DataFrame) -> pd.DataFrame:
    """One row per variant of the shared (variant, case) pairs: its verdict counts, the
    geometric mean and the worst of its time ratios (new / base) and the worst case;
    those with flagged verdicts first, then those with improvements, then by geomean,
    slowest first."""
    rows = []
    for variant, g in both.groupby("variant", sort=False):
        ratio = g["time ratio new/base"]
        ok = ratio[(ratio > 0) & np.isfinite(ratio)]
        counts = g["verdict"].fillna("no verdict").value_counts()
        worst = g.loc[ok.idxmax()] if len(ok) else None
        rows.append({
            "variant": variant,
            "verdicts": ", ".join(f"{k} {n}" for k, n in counts.items()),
            "geomean ratio": float(np.exp(np.log(ok).mean())) if len(ok) else np.nan,
            "worst ratio": float(ok.max()) if len(ok) else np.nan,
            "worst case": None if worst is None else worst["case_id"],
            "pairs": len(g),
            "flagged": int(g["verdict"].isin(FLAGGED).sum()),
            "better": int(g["verdict"].isin(GOOD).sum())})
    if not rows:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    out = pd.DataFrame(rows)
    return out.sort_values(["flagged", "better", "geomean ratio"], ascending=[False, False, False],
                           kind="stable").reset_index(drop=True)
