"""Leaderboard: scored submissions ranked as `fa-harness leaderboard` ranks them (full
perf-grid coverage first, then score: the geometric mean of speedups over the baseline,
higher is better; `harness.submissions.ranking`), the forward's board and, beside it, the
backward's (submissions that declare a `[backward]`, timed on the perf-bwd grid against
the baseline's backward), and the verdicts of the others."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from harness.dashboard import tables, ui
from harness.dashboard.data import Ctx

_BOARD_COLUMNS = ["rank", "name", "submitter", "coverage", "score", "gpu", "gpu_s",
                  "finished_at", "run"]


def _board(ctx: Ctx, ranked: pd.DataFrame, cases: str) -> None:
    ranked = ranked.assign(rank=ranked["rank"].astype(int), run=ranked["run_id"].map(
        lambda r: ui.run_href(int(r)) if r == r and r is not None else None))
    # The run link opens its page in this tab (tables.show), as every dashboard table does.
    tables.show(ctx, ranked[_BOARD_COLUMNS], key=f"board-{cases}", links=["run"],
                hide_index=True, column_config={
        "gpu": "GPU",
        "gpu_s": st.column_config.TextColumn(
            "GPU s", help="GPU seconds the job used / its budget"),
        "coverage": st.column_config.TextColumn(
            "coverage", help=f"{cases} cases timed / cases in the {cases} grid"),
        "score": st.column_config.NumberColumn(
            "score", format="%.3fx", help="geometric-mean speedup")})


def _messages(said: pd.DataFrame) -> None:
    # A table wraps long text where a data grid cuts it off; its cells are Markdown, so
    # the text is escaped (a sanitizer's "__global__" stays literal).
    shown = said[["id", "name", "verdict", "message"]].copy()
    for col in ("name", "message"):
        shown[col] = shown[col].map(ui.md_escape)
    st.table(shown.set_index("id"))


def _with_message(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["message"].notna() & df["message"].astype(str).str.len().gt(0)]


def render(ctx: Ctx) -> None:
    st.title("Leaderboard")
    subs = ctx.q("leaderboard")
    if subs.empty:
        st.info("No submissions yet. Submit a kernel variant with `fa-harness submit` or on "
                "the Submit page (a token from `fa-harness token create` is needed); a worker "
                "scores it and it appears here.")
        return
    bwd = ctx.q("leaderboard", "bwd")
    ranked = subs[subs["rank"].notna()]
    ranked_bwd = bwd[bwd["rank"].notna()]
    if not ranked.empty or not ranked_bwd.empty:
        st.markdown(
            "**How the ranking works:** coverage ranks before score. A submission timed on "
            "every case of the perf grid ranks above any submission timed on only part of "
            "it, whatever their scores; among equal coverage, the higher score ranks first. "
            "Score: the geometric mean of the speedups over the SDPA flash baseline on the "
            "timed cases (higher is better). The backward has its own board, by the same "
            "rule on the perf-bwd grid against the baseline's backward: a submission's "
            "backward never changes its forward's place.")
    left, right = st.columns(2)
    with left:
        st.subheader("Forward")
        if ranked.empty:
            st.info("No submission has been scored yet.")
        else:
            _board(ctx, ranked, "perf")
    with right:
        st.subheader("Backward")
        if ranked_bwd.empty:
            st.info("No backward has been scored yet: a submission whose manifest has a "
                    "`[backward]` table gets its dQ, dK and dV checked and timed on their "
                    "own.")
        else:
            _board(ctx, ranked_bwd, "perf-bwd")
    others = subs[subs["rank"].isna()]
    if len(others):
        st.subheader(f"Other submissions ({len(others)})")
        st.dataframe(others[["id", "name", "submitter", "status", "verdict", "gpu",
                             "gpu_s", "failing_cases", "created_at"]], hide_index=True,
                     column_config={"gpu": "GPU", "gpu_s": "GPU s"})
        said = _with_message(others)
        if len(said):
            st.markdown("##### Messages")
            _messages(said)
    others_bwd = bwd[bwd["rank"].isna()]
    if len(others_bwd):
        st.subheader(f"Backward verdicts not scored ({len(others_bwd)})")
        st.dataframe(others_bwd[["id", "name", "submitter", "verdict", "gpu_s",
                                 "failing_cases", "finished_at"]], hide_index=True,
                     column_config={"gpu_s": "GPU s"})
        said = _with_message(others_bwd)
        if len(said):
            _messages(said)
