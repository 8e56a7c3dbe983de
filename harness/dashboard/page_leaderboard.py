"""Leaderboard: scored submissions ranked as `fa-harness leaderboard` ranks them (full
perf-grid coverage first, then score: the geometric mean of speedups over the baseline,
higher is better; `harness.submissions.ranking`), and the verdicts of the others."""

from __future__ import annotations

import streamlit as st

from harness.dashboard import ui
from harness.dashboard.data import Ctx


def render(ctx: Ctx) -> None:
    st.title("Leaderboard")
    subs = ctx.q("leaderboard")
    if subs.empty:
        st.info("No submissions yet. Submit a kernel variant with `fa-harness submit` or on "
                "the Submit page (a token from `fa-harness token create` is needed); a worker "
                "scores it and it appears here.")
        return
    ranked = subs[subs["rank"].notna()]
    if ranked.empty:
        st.info("No submission has been scored yet.")
    else:
        ranked = ranked.assign(rank=ranked["rank"].astype(int), run=ranked["run_id"].map(
            lambda r: ui.run_href(int(r)) if r == r and r is not None else None))
        st.dataframe(ranked[["rank", "name", "submitter", "score", "coverage", "finished_at",
                             "run"]],
                     hide_index=True, column_config={"run": ui.RUN_LINK})
    others = subs[subs["rank"].isna()]
    if len(others):
        st.subheader(f"Other submissions ({len(others)})")
        st.dataframe(others[["id", "name", "submitter", "status", "verdict", "message",
                             "failing_cases", "created_at"]], hide_index=True)
