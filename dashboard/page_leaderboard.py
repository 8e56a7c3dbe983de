"""Leaderboard: scored submissions ranked by score (geometric mean of speedups over the
reference kernel; higher is better), and the verdicts of the others."""

from __future__ import annotations

import streamlit as st

from dashboard import ui
from dashboard.data import Ctx


def render(ctx: Ctx) -> None:
    st.title("Leaderboard")
    subs = ctx.q("submissions")
    if subs.empty:
        st.info("No submissions yet. Submit a kernel variant with `fa-harness submit` or on "
                "the Submit page (a token from `fa-harness token create` is needed); a worker "
                "scores it and it appears here.")
        return
    scored = subs[(subs["verdict"] == "scored") & subs["score"].notna()]
    if scored.empty:
        st.info("No submission has been scored yet.")
    else:
        ranked = scored.sort_values(["score", "finished_at"], ascending=[False, True])
        ranked = ranked.assign(rank=range(1, len(ranked) + 1))
        ranked = ranked.assign(run=ranked["run_id"].map(
            lambda r: ui.run_href(r) if r == r and r is not None else None))
        st.dataframe(ranked[["rank", "name", "submitter", "score", "finished_at", "run"]],
                     hide_index=True, column_config={"run": ui.RUN_LINK})
    others = subs[~subs.index.isin(scored.index)]
    if len(others):
        st.subheader(f"Other submissions ({len(others)})")
        st.dataframe(others[["id", "name", "submitter", "status", "verdict", "message",
                             "failing_cases", "created_at"]], hide_index=True)
