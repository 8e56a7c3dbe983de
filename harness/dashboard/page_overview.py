"""Overview: the latest run of each grid (perf, decode, smoke, ...) per GPU and branch, its
pass/fail counts and flagged regressions (with their commit range), and the best TFLOP/s
of every variant."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from harness.dashboard import flags as flag_list
from harness.dashboard import ui
from harness.dashboard.data import Ctx

RUN_LINK = ui.RUN_LINK


def render(ctx: Ctx) -> None:
    st.title("Overview")
    s = ctx.q("summary")
    cols = st.columns(5)
    cols[0].metric("runs", s["runs"])
    cols[1].metric("GPU models", s["gpus"])
    cols[2].metric("variants", s["variants"])
    cols[3].metric("cases", s["cases"])
    last = s["last"]
    cols[4].metric("last run", last.strftime("%Y-%m-%d") if last else "-",
                   help=f"{last:%Y-%m-%d %H:%M} UTC" if last else None)

    latest = ctx.q("latest_runs")
    ids = tuple(int(i) for i in latest["id"])
    counts = ctx.q("status_counts", ids)
    flags = ctx.q("flagged_in_runs", ids)

    st.subheader("Latest run per grid, GPU and branch")
    table = latest.rename(columns={"id": "run_id"}).copy()
    table["grid"] = table["grids"].map(
        lambda g: "+".join(map(str, g)) if isinstance(g, list) and g else "-")
    by_status = (counts.pivot_table(index="run_id", columns="status", values="n",
                                    aggfunc="sum", fill_value=0)
                 if len(counts) else pd.DataFrame(index=pd.Index([], name="run_id")))
    for col in ("passed", "failed", "skipped"):
        table[col] = table["run_id"].map(by_status.get(col, {})).fillna(0)
    other = [c for c in by_status.columns if c not in ("passed", "failed", "skipped")]
    table["crashed/timeout/error/invalid"] = (
        table["run_id"].map(by_status[other].sum(axis=1)).fillna(0) if other else 0)
    n_flags = flags.groupby("run_id").size() if len(flags) else pd.Series(dtype="int64")
    table["regressions flagged"] = table["run_id"].map(n_flags).fillna(0).astype(int)
    table["commit"] = table["commit"].map(ui.short)
    table["run"] = table["run_id"].map(ui.run_href)
    st.dataframe(
        table[["grid", "gpu_model_key", "branch", "commit", "created_at", "passed", "failed",
               "skipped", "crashed/timeout/error/invalid", "regressions flagged", "run"]],
        hide_index=True, column_config={"run": RUN_LINK, "gpu_model_key": "GPU"})

    st.subheader("Regressions flagged in these runs")
    if flags.empty:
        st.success("No regression, correctness regression or precision drift in the latest runs.")
    else:
        st.error(f"{len(flags)} flagged verdict(s) in the latest runs.")
        grouped = (flags.groupby(["gpu_model_key", "variant", "verdict", "run_id"],
                                 as_index=False)
                   .agg(cases=("case_id", "size"), worst_ratio=("ratio", "max")))
        grouped["run"] = grouped["run_id"].map(ui.run_href)
        st.dataframe(grouped.drop(columns="run_id"), hide_index=True,
                     column_config={"run": RUN_LINK, "gpu_model_key": "GPU"})
        with st.expander("Every flagged case: commit range, commits, history", expanded=True):
            flag_list.show(ctx, flags)

    st.subheader("Best TFLOP/s per variant (passing cases of the latest runs)")
    best = ctx.q("best_tflops", ids)
    if best.empty:
        st.info("No passing timed results in the latest runs.")
    else:
        gpu_of = dict(zip(latest["id"], latest["gpu_model_key"], strict=True))
        best = best.assign(gpu=best["run_id"].map(gpu_of))
        wide = best.pivot_table(index="variant", columns="gpu", values="best_tflops",
                                aggfunc="max")
        first = wide.columns[0]
        st.dataframe(wide.sort_values(first, ascending=False).round(1))

    recent = ctx.q("recent_flags", 20)
    if len(recent):
        with st.expander(f"Most recent flagged verdicts anywhere ({len(recent)})"):
            recent = recent.assign(commit=recent["commit"].map(ui.short),
                                   run=recent["run_id"].map(ui.run_href))
            st.dataframe(recent.drop(columns=["run_id"]), hide_index=True,
                         column_config={"run": RUN_LINK})
