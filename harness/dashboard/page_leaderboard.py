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
        st.markdown(
            "**How the ranking works:** coverage ranks before score. A submission timed on "
            "every case of the perf grid ranks above any submission timed on only part of "
            "it, whatever their scores; among equal coverage, the higher score ranks first. "
            "Score: the geometric mean of the speedups over the SDPA flash baseline on the "
            "timed cases (higher is better).")
        ranked = ranked.assign(rank=ranked["rank"].astype(int), run=ranked["run_id"].map(
            lambda r: ui.run_href(int(r)) if r == r and r is not None else None))
        st.dataframe(ranked[["rank", "name", "submitter", "coverage", "score", "gpu",
                             "gpu_s", "finished_at", "run"]],
                     hide_index=True, column_config={
                         "run": ui.RUN_LINK, "gpu": "GPU",
                         "gpu_s": st.column_config.TextColumn(
                             "GPU s", help="GPU seconds the job used / its budget"),
                         "coverage": st.column_config.TextColumn(
                             "coverage", help="perf cases timed / cases in the perf grid"),
                         "score": st.column_config.NumberColumn(
                             "score", format="%.3fx", help="geometric-mean speedup")})
    others = subs[subs["rank"].isna()]
    if len(others):
        st.subheader(f"Other submissions ({len(others)})")
        st.dataframe(others[["id", "name", "submitter", "status", "verdict", "gpu",
                             "gpu_s", "failing_cases", "created_at"]], hide_index=True,
                     column_config={"gpu": "GPU", "gpu_s": "GPU s"})
        said = others[others["message"].notna() & others["message"].astype(str).str.len().gt(0)]
        if len(said):
            st.markdown("##### Messages")
            # A table wraps long text where a data grid cuts it off; its cells are
            # Markdown, so the text is escaped (a sanitizer's "__global__" stays literal).
            shown = said[["id", "name", "verdict", "message"]].copy()
            for col in ("name", "message"):
                shown[col] = shown[col].map(ui.md_escape)
            st.table(shown.set_index("id"))
