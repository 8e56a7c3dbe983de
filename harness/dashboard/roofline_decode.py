"""The Roofline page's decode section: decode-shaped cases (Nq <= DECODE_MAX_SEQLEN_Q) do
a few FLOPs per byte of KV cache they read, so their ceiling is bandwidth, and they are
shown as achieved GB/s (bytes / median time) against the copy ceiling the runner measured
at calibration, per variant and case, with the KV cache's layout (contiguous, paged and
its page size, varlen) on every point: paged against contiguous, and one variant against
another, read off the same chart and the table under it."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from harness.dashboard import charts, ui
from harness.dashboard.case_kinds import DECODE_MAX_SEQLEN_Q, decode_points, decode_table

BYTES = {"model": "IO model bytes (bytes_model)",
         "ideal": "ideal bytes: Q, K, V, O once (bytes_ideal)",
         "measured": "measured DRAM bytes (Nsight)"}


def _bytes(res: pd.DataFrame, source: str) -> pd.Series:
    if source == "measured":
        return res["bytes_read"].astype("float64") + res["bytes_write"].fillna(0)
    return res[f"bytes_{source}"].astype("float64")


def render(res: pd.DataFrame, kinds: pd.DataFrame, copy_gbps: float | None,
           title: str) -> None:
    """The section for one run's results `res` (already through the case filter); nothing
    when the run has no decode-shaped case."""
    if res.empty or not res["seqlen_q"].le(DECODE_MAX_SEQLEN_Q).any():
        return
    st.subheader("Decode: achieved bandwidth")
    # Ideal first: the same bytes for every variant of a case, so the GB/s of two kernels
    # compare as their times do (the IO model's bytes differ per algorithm).
    options = ["ideal", "model"] + (["measured"] if res["bytes_read"].notna().any() else [])
    source = st.radio("Decode bytes", options, format_func=BYTES.__getitem__,
                      horizontal=True, index=0, key="decode_bytes")
    pts = decode_points(res, kinds, _bytes(res, source), copy_gbps)
    if pts.empty:
        st.info(f"No passing timed decode-shaped result (Nq <= {DECODE_MAX_SEQLEN_Q}) with "
                f"{BYTES[source]}.")
        return
    st.altair_chart(charts.decode_bandwidth_chart(pts, copy_gbps, title), width="stretch")
    ceiling = (f"the runner's copy ceiling, {ui.fmt_num(copy_gbps)} GB/s (dashed)"
               if copy_gbps else "no copy ceiling (this run recorded no calibration)")
    st.caption(f"Decode-shaped cases (Nq <= {DECODE_MAX_SEQLEN_Q}) are memory bound: "
               f"achieved GB/s = {BYTES[source]} / median time, against {ceiling}. "
               "Layout: the KV cache contiguous, paged (page size in keys) or a varlen "
               "batch. The ideal bytes count every tensor once, the same for every variant "
               "of a case; an algorithm's IO model may count K/V once per query head "
               "(a GQA group then shares them through L2, and the fraction can pass 1).")
    table = decode_table(pts)
    if not copy_gbps:
        table = table.drop(columns=["best of copy"])
    st.dataframe(table, hide_index=True, column_config={
        "best GB/s": st.column_config.NumberColumn(format="%.0f"),
        "median GB/s": st.column_config.NumberColumn(format="%.0f"),
        "best of copy": st.column_config.NumberColumn(format="%.2f")})
    with st.expander(f"Every decode point ({len(pts)})"):
        st.dataframe(pts, hide_index=True, column_config={
            "gbps": st.column_config.NumberColumn("GB/s", format="%.0f"),
            "of_copy": st.column_config.NumberColumn("of copy", format="%.2f")})
