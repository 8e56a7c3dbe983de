"""Compare: two runs (or two commits on one GPU) side by side, with stored verdicts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from harness.dashboard import ui
from harness.dashboard.data import Ctx
from harness.dashboard.queries import FLAGGED, GOOD


def _resolve(ctx: Ctx, name: str, gpu: str | None) -> int | None:
    token = ui.param(name)
    if token is None:
        return None
    run_id = ctx.q("resolve_run", token, gpu)
    if run_id is None:
        st.error(f"`{name}={token}`: no run with that id, and no commit starting with it on "
                 f"{gpu or 'any GPU'}.")
    return run_id


def render(ctx: Ctx) -> None:
    st.title("Compare")
    gpus = ctx.q("gpus")
    gpu = ui.pick("GPU", gpus, "gpu") if gpus else None
    runs = ctx.q("runs_list", gpu, 500)
    if len(runs) < 1:
        st.info("No runs on this GPU.")
        return
    new_id = _resolve(ctx, "new", gpu)
    base_id = _resolve(ctx, "base", gpu)
    # Runs named by the link but older than the picker's window still get an entry.
    extra = [r for r in (new_id, base_id) if r is not None and r not in set(runs["id"])]
    rows = [ctx.q("run_detail", r) for r in extra]
    if rows:
        runs = pd.concat([runs, pd.DataFrame(rows)[runs.columns]], ignore_index=True)
    labels = {int(r["id"]): ui.run_label(r) for _, r in runs.iterrows()}
    ids = list(labels)
    if new_id is None:
        new_id = ids[0]
    if base_id is None:
        base_id = ids[1] if len(ids) > 1 and ids[0] == new_id else ids[0]
    c1, c2 = st.columns(2)
    base_id = c1.selectbox("Base run", ids, index=ids.index(base_id), format_func=labels.get)
    new_id = c2.selectbox("New run", ids, index=ids.index(new_id), format_func=labels.get)
    ui.set_params(base=base_id, new=new_id)
    if base_id == new_id:
        st.warning("Base and new are the same run; pick two different runs.")

    base = ctx.q("run_results", base_id)
    new = ctx.q("run_results", new_id)
    keys = ["variant", "case_id"]
    cols = ["status", "median_ms", "tflops", "err_ratio"]
    both = pd.merge(base[keys + cols], new[keys + cols], on=keys, how="outer",
                    suffixes=(" base", " new"))
    both["time ratio new/base"] = both["median_ms new"] / both["median_ms base"]
    comps = ctx.q("run_comparisons", new_id)
    stored = comps[comps["base_run_id"] == base_id] if len(comps) else comps
    if len(stored):
        both = both.merge(stored[["variant", "case_id", "verdict", "p_value"]], on=keys,
                          how="left")
    else:
        both["verdict"] = None
        st.info("No verdicts are stored for this pair of runs (verdicts are recorded when a "
                "run is compared against its baseline); the time ratios below are raw.")

    counts = both["verdict"].value_counts()
    cols_m = st.columns(4)
    cols_m[0].metric("pairs", len(both))
    cols_m[1].metric("regressions", int(counts[counts.index.isin(FLAGGED)].sum()))
    cols_m[2].metric("improvements", int(counts[counts.index.isin(GOOD)].sum()))
    ratio = both["time ratio new/base"].dropna()
    ratio = ratio[ratio > 0]
    geo = f"{float(np.exp(np.log(ratio).mean())):.3f}" if len(ratio) else "-"
    cols_m[3].metric("geomean time ratio", geo)

    order = both["verdict"].isin(FLAGGED).map({True: 0, False: 1})
    both = both.assign(_o=order).sort_values(["_o", "time ratio new/base"],
                                             ascending=[True, False]).drop(columns="_o")
    st.dataframe(both, hide_index=True)
    st.markdown(f"[base run #{base_id}]({ui.run_href(base_id)}) · "
                f"[new run #{new_id}]({ui.run_href(new_id)})")
