"""Correctness: the variant x case matrix of error ratios of one run, and the error-ratio
history of a variant (the tolerance rule bounds the ratio at 2)."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from harness.dashboard import case_filter, charts, commits, ui
from harness.dashboard.data import Ctx
from harness.dashboard.page_roofline import pick_gpu_and_run

HEATMAP_MAX_CELLS = 6000  # beyond this a heat map is unreadable; the table remains


def render(ctx: Ctx) -> None:
    st.title("Correctness")
    gpu, run_id = pick_gpu_and_run(ctx)
    if run_id is None:
        st.info("No runs on this GPU.")
        return
    flt = case_filter.pick(ctx)
    res = flt.apply(ctx.q("run_results", run_id))
    counts = res["status"].value_counts()
    cols = st.columns(4)
    cols[0].metric("passed", int(counts.get("passed", 0)))
    cols[1].metric("failed", int(counts.get("failed", 0)))
    cols[2].metric("skipped", int(counts.get("skipped", 0)))
    cols[3].metric("crashed/timeout/error/invalid",
                   int(sum(counts.get(s, 0) for s in ("crashed", "timeout", "error", "invalid"))))
    if res.empty:
        st.info(f"This run has no results of the chosen case kinds ({flt.label})."
                if flt.active else "This run has no results.")
        return
    if len(res) <= HEATMAP_MAX_CELLS:
        st.altair_chart(charts.correctness_heatmap(res), width="stretch")
        st.caption("One row per variant, one column per case. Error ratio = max|out - ref| / "
                   "max|naive same-precision - ref|; the tolerance is 2. Black outline: not "
                   "passed.")
    bad = res[~res["status"].isin(["passed", "skipped"])]
    if len(bad):
        st.subheader(f"Not passed ({len(bad)})")
        st.dataframe(bad[["variant", "case_id", "status", "err_ratio", "message"]],
                     hide_index=True,
                     column_config={"message": st.column_config.TextColumn(width="large")})
    else:
        st.success("Every case passed or was skipped with a reason.")

    st.subheader("Error-ratio history")
    variants = sorted(res["variant"].unique())
    variant = ui.pick("Variant", variants, "variant")
    if gpu and variant:
        hist = ctx.q("err_ratio_history", variant, gpu)
        if len(hist):
            hist = commits.in_commit_order(hist)
            hist["grid"] = hist["grids"].map(_grid)
            hist["when"] = pd.to_datetime(hist["created_at"]).dt.strftime("%Y-%m-%d %H:%M UTC")
            st.altair_chart(charts.err_ratio_chart(hist, "max_err_ratio",
                                                   f"worst error ratio of {variant} on {gpu}"),
                            width="stretch")
            st.caption("In commit order, one line per grid; dashed: the tolerance.")


def _grid(text: object) -> str:
    """The grids of a run, from their JSON text (err_ratio_history groups by it)."""
    try:
        grids = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return str(text)
    return "+".join(map(str, grids)) if isinstance(grids, list) and grids else "-"
