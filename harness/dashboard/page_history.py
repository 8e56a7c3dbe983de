"""History: one variant x case x GPU over commits, with the noise band and the verdicts."""

from __future__ import annotations

import streamlit as st

from harness.dashboard import charts, ui
from harness.dashboard.data import Ctx
from harness.dashboard.queries import FLAGGED

METRICS = {"tflops": "TFLOP/s", "median_ms": "time (ms)"}


def render(ctx: Ctx) -> None:
    st.title("History")
    variants, cases, gpus = ctx.q("variant_names"), ctx.q("case_ids"), ctx.q("gpus")
    if not (variants and cases and gpus):
        st.info("No variant, case or GPU recorded yet.")
        return
    c1, c2, c3, c4 = st.columns([2, 3, 2, 1])
    variant = ui.pick("Variant", variants, "variant", where=c1)
    case_id = ui.pick("Case", cases, "case", where=c2)
    gpu = ui.pick("GPU", gpus, "gpu", where=c3)
    metric = ui.pick("Metric", list(METRICS), "metric", fmt=METRICS.__getitem__, where=c4)
    branches = ctx.q("branches")
    branch = None
    if len(branches) > 1:
        choice = ui.pick("Branch", ["all", *branches], "branch")
        branch = None if choice == "all" else choice

    df = ctx.q("series", variant, case_id, gpu, branch)
    if df.empty:
        st.info(f"No results for {variant} on {case_id} on {gpu}.")
        return
    flags = ctx.q("series_flags", variant, case_id)
    # One verdict per run: a flagged one wins over an improvement.
    if len(flags):
        flags = flags.assign(bad=flags["verdict"].isin(FLAGGED)).sort_values("bad")
        verdict = flags.drop_duplicates("run_id", keep="last").set_index("run_id")["verdict"]
    else:
        verdict = {}
    frame = charts.history_frame(df, metric)
    frame["verdict"] = frame["run_id"].map(verdict)
    frame["href"] = frame["run_id"].map(ui.run_href)
    timed = frame[frame["value"].notna()]
    title = f"{variant} | {case_id} | {gpu}"
    if timed.empty:
        st.info("These results carry no timing.")
    else:
        st.altair_chart(charts.history_chart(timed, metric, title), width="stretch")
        st.caption("Band: interquartile range of the samples around the median; dotted: "
                   "best sample. Red: regression verdicts, green: improvements. "
                   "Click a point to open its run.")
    bad = frame[frame["verdict"].isin(FLAGGED)]
    link = ui.RUN_LINK
    if len(bad):
        st.subheader(f"Flagged runs ({len(bad)})")
        st.dataframe(bad[["created_at", "commit_short", "verdict", "value", "status", "href"]],
                     hide_index=True, column_config={"href": link})
    with st.expander(f"All {len(frame)} points"):
        st.dataframe(frame[["created_at", "commit_short", "branch", "status", "value",
                            "median_ms", "iqr_ms", "min_ms", "err_ratio", "verdict", "href"]],
                     hide_index=True, column_config={"href": link})
