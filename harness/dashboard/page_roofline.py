"""Roofline: arithmetic intensity vs achieved TFLOP/s of one run, under the ceilings its
runner measured at calibration (copy bandwidth, dense matmul throughput); then its
decode-shaped cases as achieved GB/s against the copy ceiling (roofline_decode)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from harness.dashboard import case_filter, charts, roofline_decode, ui
from harness.dashboard.data import Ctx

BYTES = {"model": "IO model bytes (bytes_model)", "measured": "measured DRAM bytes (Nsight)"}


def pick_run(ctx: Ctx, gpu: str | None) -> int | None:
    """The run named by `run=` (checked), else a picker over recent runs on `gpu`."""
    runs = ctx.q("runs_list", gpu, 300)
    token = ui.param("run")
    wanted = ctx.q("resolve_run", token, gpu) if token else None
    if token and wanted is None:
        st.error(f"`run={token}`: no such run in this database.")
    if runs.empty:
        return wanted
    labels = {int(r["id"]): ui.run_label(r) for _, r in runs.iterrows()}
    if wanted is not None and wanted not in labels:
        row = ctx.q("run_detail", wanted)
        labels = {wanted: ui.run_label(row), **labels}
    ids = list(labels)
    index = ids.index(wanted) if wanted in labels else 0
    run_id = st.selectbox("Run", ids, index=index, format_func=labels.get)
    ui.set_params(run=run_id)
    return run_id


def pick_gpu_and_run(ctx: Ctx) -> tuple[str | None, int | None]:
    """The GPU picker and, next to it, `pick_run` over that GPU's runs. A link naming a
    run (`?run=67`) opens that run's GPU; picking another GPU then leaves the run."""
    names = ctx.q("gpu_names")
    token = ui.param("run")
    wanted = ctx.q("resolve_run", token, None) if token else None
    run_gpu = None
    if wanted is not None:
        run_gpu = (ctx.q("run_detail", wanted) or {}).get("gpu_model_key")
    fresh = not st.session_state.get("_fa_rendered")
    if run_gpu and fresh and ui.param("gpu") != run_gpu:
        st.query_params["gpu"] = run_gpu
    st.session_state["_fa_rendered"] = True
    c1, c2 = st.columns([1, 1])
    with c1:
        gpu = ui.pick_gpu(names) if names else None
    if run_gpu and gpu and gpu != run_gpu:
        st.query_params.pop("run", None)  # the GPU was changed away from the linked run
    with c2:
        run_id = pick_run(ctx, gpu)
    return gpu, run_id


def ceilings(calibration: dict | None) -> tuple[float | None, dict[str, float]]:
    """Copy bandwidth (GB/s) and the matmul ceiling of each dtype (TFLOP/s) the runner
    measured: `matmul_tflops_by_dtype` ({"float16": ..., "bfloat16": ...}), else the single
    `matmul_tflops` (of float16), else older per-dtype keys."""
    cal = calibration or {}
    bw = cal.get("copy_gbps")
    peaks: dict[str, float] = {}
    by_dtype = cal.get("matmul_tflops_by_dtype")
    if isinstance(by_dtype, dict):
        peaks = {str(k): float(v) for k, v in by_dtype.items()
                 if isinstance(v, (int, float)) and v > 0}
    if not peaks:
        for dtype, key in (("float16", "matmul_tflops_fp16"), ("bfloat16", "matmul_tflops_bf16"),
                           ("float16", "matmul_tflops")):
            if isinstance(cal.get(key), (int, float)) and dtype not in peaks:
                peaks[dtype] = float(cal[key])
    return (float(bw) if isinstance(bw, (int, float)) and bw > 0 else None), peaks


def roof_of(dtypes: pd.Series, intensity: pd.Series, bw: float | None,
            peaks: dict[str, float]) -> pd.Series:
    """The roof over each point: its own dtype's matmul ceiling (the highest one when its
    dtype was not calibrated), capped by intensity x copy bandwidth."""
    top = max(peaks.values()) if peaks else np.inf
    peak = dtypes.map(peaks).astype("float64").fillna(top)
    return np.minimum(peak, intensity * (bw or np.inf) / 1000.0)


def render(ctx: Ctx) -> None:
    st.title("Roofline")
    _gpu, run_id = pick_gpu_and_run(ctx)
    if run_id is None:
        st.info("No runs on this GPU.")
        return
    flt = case_filter.pick(ctx)
    detail = ctx.q("run_detail", run_id)
    res = flt.apply(ctx.q("run_results", run_id))
    bw, peaks = ceilings(detail.get("calibration"))
    title = f"run #{run_id} {ui.short(detail.get('commit'))} on {detail.get('gpu_name')}"
    if flt.active and res.empty:
        st.info(f"Run #{run_id} has no result of the chosen case kinds ({flt.label}).")
        return
    _flop_roofline(res, bw, peaks, title, flt)
    roofline_decode.render(res, flt.kinds, bw, title)


def _flop_roofline(res: pd.DataFrame, bw: float | None, peaks: dict[str, float], title: str,
                   flt: case_filter.KindFilter) -> None:
    has_measured = bool(res["bytes_read"].notna().any()) if len(res) else False
    source = st.radio("Bytes", list(BYTES), format_func=BYTES.__getitem__, horizontal=True,
                      index=0, disabled=not has_measured)
    if source == "measured":
        nbytes = res["bytes_read"].astype("float64") + res["bytes_write"].fillna(0)
    else:
        nbytes = res["bytes_model"].astype("float64")
    pts = res.assign(bytes=nbytes)
    pts = pts[(pts["status"] == "passed") & pts["tflops"].gt(0) & pts["bytes"].gt(0)
              & pts["flops"].notna()]
    if pts.empty:
        kinds = f" of the chosen case kinds ({flt.label})" if flt.active else ""
        st.info(f"This run has no passing result{kinds} with FLOPs, bytes and timing.")
        return
    pts = pts.assign(intensity=pts["flops"].astype("float64") / pts["bytes"])
    if not bw and not peaks:
        st.caption("This run recorded no calibration, so no ceilings are drawn.")
    st.altair_chart(charts.roofline_chart(
        pts[["intensity", "tflops", "variant", "case_id", "dtype"]], bw, peaks, title),
        width="stretch")
    if bw or peaks:
        pts = pts.assign(of_roof=pts["tflops"] / roof_of(pts["dtype"], pts["intensity"],
                                                         bw, peaks))
        summary = (pts.groupby("variant")
                   .agg(cases=("case_id", "size"), best_tflops=("tflops", "max"),
                        median_of_roof=("of_roof", "median"), best_of_roof=("of_roof", "max"))
                   .sort_values("best_tflops", ascending=False))
        st.caption(f"Ceilings measured by the runner: copy {ui.fmt_num(bw)} GB/s; matmul "
                   + (", ".join(f"{k} {ui.fmt_num(v)} TFLOP/s" for k, v in peaks.items())
                      or "not calibrated")
                   + ". Fraction of roof: each point against its own dtype's roof.")
        st.dataframe(summary.round(3))
    else:
        st.dataframe(pd.DataFrame(pts.groupby("variant")["tflops"].max()).round(1))
