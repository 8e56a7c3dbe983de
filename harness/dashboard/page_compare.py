"""Compare: two runs side by side (by run id or commit), on one GPU with the stored
verdicts, or across two GPU models with the time ratio only (timings of different GPU
models get no regression verdict). Without a base named, the new run's stored baseline.
A per-variant table first (verdict counts, geomean and worst ratio, worst case; flagged
variants first), then every case."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from harness.dashboard import case_filter, ui
from harness.dashboard.compare_data import per_variant
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


def _runs(ctx: Ctx, gpu: str | None, *named: int | None) -> tuple[list[int], dict[int, str]]:
    runs = ctx.q("runs_list", gpu, 500)
    # Runs named by the link but outside the picker's window still get an entry.
    extra = [r for r in named if r is not None and r not in set(runs["id"])]
    rows = [ctx.q("run_detail", r) for r in extra]
    if rows:
        runs = pd.concat([runs, pd.DataFrame(rows)[runs.columns]], ignore_index=True)
    labels = {int(r["id"]): ui.run_label(r) for _, r in runs.iterrows()}
    return list(labels), labels


def _gpu_of_run(ctx: Ctx, run_id: int | None) -> str | None:
    return None if run_id is None else (ctx.q("run_detail", run_id) or {}).get("gpu_model_key")


def render(ctx: Ctx) -> None:
    st.title("Compare")
    names = ctx.q("gpu_names")
    if not names:
        st.info("No runs recorded.")
        return
    # Runs named by id decide their GPU; `gpu=` (and `base_gpu=` for the base run, when
    # it is on another GPU model) pick the rest.
    alert = _alert(ctx, next(iter(names)))
    new_id = _resolve(ctx, "new", ui.param("gpu") if ui.param("gpu") in names else None)
    base_gpu_param = ui.param("base_gpu") or ui.param("gpu")
    base_id = _resolve(ctx, "base", base_gpu_param if base_gpu_param in names else None)
    new_gpu0 = _gpu_of_run(ctx, new_id)
    base_gpu0 = _gpu_of_run(ctx, base_id)
    if new_gpu0 and ui.param("gpu") is None:
        st.query_params["gpu"] = new_gpu0
    if base_gpu0 and base_gpu0 != (ui.param("gpu") or new_gpu0):
        st.query_params["base_gpu"] = base_gpu0

    c1, c2 = st.columns(2)
    new_gpu = ui.pick_gpu(names, "New run's GPU", "gpu", where=c2)
    base_gpu = ui.pick_gpu(names, "Base run's GPU", "base_gpu", default=new_gpu, where=c1)
    if base_gpu == new_gpu:
        ui.set_params(base_gpu=None)
    new_ids, new_labels = _runs(ctx, new_gpu, new_id)
    base_ids, base_labels = _runs(ctx, base_gpu, base_id)
    if not new_ids or not base_ids:
        st.info("No runs on this GPU.")
        return
    if new_id not in new_labels:
        new_id = new_ids[0]
    if base_id not in base_labels:
        # The baseline the new run was judged against (same grid and GPU), else the
        # newest other run.
        stored = ctx.q("default_base", new_id)
        if stored is not None and stored not in base_labels:
            base_ids, base_labels = _runs(ctx, base_gpu, base_id, stored)
        later = [r for r in base_ids if r != new_id]
        base_id = stored if stored in base_labels else (later[0] if later else base_ids[0])
    base_id = c1.selectbox("Base run", base_ids, index=base_ids.index(base_id),
                           format_func=base_labels.get)
    new_id = c2.selectbox("New run", new_ids, index=new_ids.index(new_id),
                          format_func=new_labels.get)
    ui.set_params(base=base_id, new=new_id)
    if alert is not None:
        _alert_banner(alert, base_id, new_id)
    if base_id == new_id:
        if len(set(base_ids) | set(new_ids)) < 2:
            st.info("This is the only run on this GPU: nothing to compare it with yet.")
            return
        st.warning("Base and new are the same run; pick two different runs.")
    cross = base_gpu != new_gpu

    base = ctx.q("run_results", base_id)
    new = ctx.q("run_results", new_id)
    keys = ["variant", "case_id"]
    cols = ["status", "median_ms", "tflops", "err_ratio"]
    both = pd.merge(base[keys + cols], new[keys + cols], on=keys, how="inner",
                    suffixes=(" base", " new"))
    only_base = len(base) - len(both)
    only_new = len(new) - len(both)
    if both.empty:
        st.warning(f"These runs share no (variant, case): run #{base_id} has {len(base)} "
                   f"result(s), run #{new_id} has {len(new)}, none of the same variant on "
                   "the same case (another grid, or other variants). Pick runs of the same "
                   "grid.")
        _links(ctx, base_id, new_id)
        return
    both["time ratio new/base"] = both["median_ms new"] / both["median_ms base"]
    if cross:
        both["verdict"] = None
        both["p_value"] = np.nan
        st.info(f"Runs on two GPU models ({names.get(base_gpu, base_gpu)} vs "
                f"{names.get(new_gpu, new_gpu)}): time ratios per case only; regression "
                "verdicts are only given within one GPU model.")
    else:
        _confirmed_note(ctx, new_id)
        comps = ctx.q("run_comparisons", new_id)
        stored = comps[comps["base_run_id"] == base_id] if len(comps) else comps
        if len(stored):
            both = both.merge(stored[["variant", "case_id", "verdict", "p_value"]], on=keys,
                              how="left")
        else:
            both["verdict"] = None
            both["p_value"] = np.nan
            st.info("No verdicts are stored for this pair of runs (verdicts are recorded "
                    "when a run is compared against its baseline: `fa-harness ci`, "
                    "`fa-harness import`); the time ratios below are raw.")
    if only_base or only_new:
        st.caption(f"{len(both)} shared (variant, case) pair(s); {only_base} only in the base "
                   f"run, {only_new} only in the new run (not shown).")
    flt = case_filter.pick(ctx)
    if flt.active:
        shared = len(both)
        both = flt.apply(both)
        st.caption(f"{len(both)} of the {shared} shared pairs are of the chosen case kinds "
                   f"({flt.label}); the counts and tables below are of those.")
        if both.empty:
            st.info("No shared (variant, case) pair of the chosen case kinds.")
            _links(ctx, base_id, new_id)
            return

    # A stored "same" of a pair without a time on either side (a correctness-only case,
    # a skipped one) says nothing of speed: it is counted as what it is.
    untimed = (both["verdict"] == "same") & (both["median_ms base"].isna()
                                             | both["median_ms new"].isna())
    skipped = (both["status base"] == "skipped") | (both["status new"] == "skipped")
    both.loc[untimed, "verdict"] = "untimed"
    both.loc[untimed & skipped, "verdict"] = "skipped"
    counts = both["verdict"].value_counts()
    cols_m = st.columns(4)
    cols_m[0].metric("pairs", len(both))
    cols_m[1].metric("regressions", "-" if cross else
                     int(counts[counts.index.isin(FLAGGED)].sum()))
    cols_m[2].metric("improvements", "-" if cross else
                     int(counts[counts.index.isin(GOOD)].sum()))
    ratio = both["time ratio new/base"].dropna()
    ratio = ratio[ratio > 0]
    geo = f"{float(np.exp(np.log(ratio).mean())):.3f}" if len(ratio) else "-"
    cols_m[3].metric("geomean time ratio", geo)

    _links(ctx, base_id, new_id)
    st.subheader("Per variant")
    summary = per_variant(both)
    st.dataframe(summary.drop(columns=["flagged", "better"]), hide_index=True,
                 column_config={
                     "verdicts": st.column_config.TextColumn(width="large"),
                     "geomean ratio": st.column_config.NumberColumn(format="%.3f"),
                     "worst ratio": st.column_config.NumberColumn(format="%.3f")})

    st.subheader("Per case")
    order = both["verdict"].isin(FLAGGED).map({True: 0, False: 1})
    both = both.assign(_o=order).sort_values(["_o", "time ratio new/base"],
                                             ascending=[True, False]).drop(columns="_o")
    # Base and new side by side, what decides first (the rest is off to the right).
    first = ["verdict", "time ratio new/base", "variant", "case_id", "median_ms base",
             "median_ms new", "tflops base", "tflops new", "status base", "status new",
             "p_value"]
    both = both[first + [c for c in both.columns if c not in first]]
    st.dataframe(both, hide_index=True, column_config={
        "time ratio new/base": st.column_config.NumberColumn(format="%.3f"),
        "p_value": st.column_config.NumberColumn("p", format="%.2g")})


def _alert(ctx: Ctx, busiest: str) -> dict | None:
    """The alert Compare opens on: `?alert=ID`, else (Compare opened bare, from the
    sidebar) the newest open or acknowledged alert of the GPU model the pickers open on
    (`busiest`: the one with the most runs, unless `gpu=` names one), the team's first;
    its runs become `base` and `new` unless the link names them."""
    wanted = ui.param("alert")
    bare = wanted is None and ui.param("base") is None and ui.param("new") is None
    if wanted is None and bare:
        rows = ctx.q("stored_alerts", ("open", "acknowledged"), None,
                     ui.param("gpu") or busiest, None)
        if len(rows):
            wanted = str(int(rows.sort_values("owned", ascending=False,
                                              kind="stable").iloc[0]["id"]))
    if wanted is None:
        return None
    alert = ctx.q("alert_detail", int(wanted)) if wanted.isdigit() else None
    if alert is None:
        st.warning(f"`alert={wanted}`: no alert by that id.")
        st.query_params.pop("alert", None)
        return None
    st.query_params["alert"] = str(alert["id"])
    if ui.param("new") is None and alert["run_id"] is not None:
        st.query_params["new"] = str(int(alert["run_id"]))
        if ui.param("base") is None and alert["base_run_id"] is not None:
            st.query_params["base"] = str(int(alert["base_run_id"]))
    return alert


def _alert_banner(alert: dict, base_id: int, new_id: int) -> None:
    shows = (alert["base_run_id"], alert["run_id"]) == (base_id, new_id)
    rng = f"{ui.short(alert['last_good'])}..{ui.short(alert['first_bad'])}"
    who = "" if alert["owned"] else " (a yardstick's: never fails the gate)"
    text = (f"Alert #{alert['id']} ({alert['state']}){who}: {alert['variant']} on "
            f"{alert['gpu_model_key']}, {alert['verdict']} on {alert['cases']} case(s) "
            f"from commits {rng}"
            + (f", worst {alert['worst_ratio']:.3f}x" if alert["worst_ratio"] else "")
            + ("" if shows else "; the runs picked below are not the alert's own"))
    (st.error if alert["state"] == "open" else st.info)(text)
    st.code(alert["bisect"], language=None)


def _links(ctx: Ctx, base_id: int, new_id: int) -> None:
    c1, c2, _ = st.columns([1, 1, 4])
    ui.page_link(ctx, "run", f"base run #{base_id}", where=c1, run=base_id)
    ui.page_link(ctx, "run", f"new run #{new_id}", where=c2, run=new_id)


def _confirmed_note(ctx: Ctx, run_id: int) -> None:
    """A run the gate timed again before judging (env.ci_confirm): its verdicts read the
    mean of its runs, while the medians and ratios here are its first run's."""
    env = (ctx.q("run_detail", run_id) or {}).get("env")
    rows = env.get("ci_confirm") if isinstance(env, dict) else None
    if not isinstance(rows, list) or not rows:
        return
    what = ", ".join(f"{ui.md_escape(str(r.get('kernel'))[:80])} ({r.get('pass')}): "
                     f"{1 + int(r.get('runs') or 0)} runs" for r in rows if isinstance(r, dict))
    st.info(f"Run #{run_id} was timed again before it was judged ({what}): its verdicts "
            "read the mean of those runs against its baseline window; the medians and "
            "ratios below are its first run's (the Run page lists them).")

