"""The Leaderboard page's reads: the submissions, ranked as `fa-harness leaderboard` ranks
them, on the forward's board and the backward's (plain functions of an Engine; nothing
here imports Streamlit)."""

from __future__ import annotations

import pandas as pd
from sqlalchemy import Engine, inspect, select

from harness.dashboard.schema import Run, Submission
from harness.submissions.ranking import COLUMNS, FWD, leaderboard_rows


def has_table(engine: Engine, name: str) -> bool:
    with engine.connect() as conn:
        return inspect(conn).has_table(name)


def leaderboard(engine: Engine, pass_name: str = FWD) -> pd.DataFrame:
    """Every entry of the board of `pass_name` ("fwd": every submission; "bwd": every
    backward entry): the scored ones ranked exactly as `fa-harness leaderboard` ranks them
    (`harness.submissions.ranking`), then the others, newest first, with rank NaN."""
    if not has_table(engine, Submission.__tablename__):
        return pd.DataFrame(columns=[*COLUMNS, "gpu"])
    subs = pd.DataFrame(leaderboard_rows(engine, include_all=True, limit=1000,
                                         pass_name=pass_name),
                        columns=list(COLUMNS))
    # The GPU a submission was scored on is that of its scoring run.
    run_ids = sorted({int(r) for r in subs["run_id"].dropna()})
    gpu_of: dict[int, str] = {}
    if run_ids:
        with engine.connect() as conn:
            gpu_of = {int(i): (n or k) for i, n, k in conn.execute(
                select(Run.id, Run.gpu_name, Run.gpu_model_key).where(Run.id.in_(run_ids)))}
    subs["gpu"] = subs["run_id"].map(lambda r: gpu_of.get(int(r)) if pd.notna(r) else None)
    return subs
