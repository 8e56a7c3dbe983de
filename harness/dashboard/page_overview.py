"""Overview: the alert list first (every regression of the history, open or recovered,
with its commit range and a link each to the History of its worst case and to the Compare
of the runs that flagged it), then the latest run of each grid (perf, decode, smoke, ...)
per GPU and branch with its pass/fail counts, and the best TFLOP/s of every variant per
grid."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from harness.dashboard import commits, tables, ui
from harness.dashboard import flags as flag_list
from harness.dashboard.data import Ctx

VERDICT_WORDS = {"regression": "slower", "correctness_regression": "now failing",
                 "precision_drift": "precision drift"}


def _commit(repo: str | None, commit: str | None, width: int = 10) -> str:
    short = ui.md_escape(ui.short(commit)[:width])
    url = commits.commit_url(repo, commit) if commit else None
    return f"[`{short}`]({url})" if url else f"`{short}`"


def alerts(ctx: Ctx) -> None:
    rows = ctx.q("alert_list", 40)
    st.subheader("Alerts")
    if rows.empty:
        st.success("No regression, correctness regression or precision drift in the history.")
        return
    n_open = int((rows["state"] == "open").sum())
    line = f"{n_open} open, {len(rows) - n_open} recovered (newest {len(rows)} shown)"
    (st.error if n_open else st.info)(line)
    urls = ctx.q("repository_urls", tuple(sorted({int(r) for r in rows["run_id"]})))
    widths = [1.0, 2.2, 2.0, 2.4, 1.2, 1.3]
    head = st.columns(widths)
    for col, name in zip(head, ("state", "GPU · candidate", "what", "last good..first bad",
                                "", ""), strict=True):
        col.caption(name)
    for _, a in rows.iterrows():
        c = st.columns(widths, vertical_alignment="center")
        repo = urls.get(int(a["run_id"]))
        if a["state"] == "open":
            c[0].markdown(":red[**open**]")
        else:
            # Seven characters: the state column is narrow.
            c[0].markdown(f":green[recovered] {_commit(repo, a['recovered_at'], 7)}")
        c[1].markdown(f"{ui.md_escape(a['gpu_model_key'])} · **{ui.md_escape(a['variant'])}**")
        ratio = a["worst_ratio"]
        worst = f"{ratio:.3f}x" if pd.notna(ratio) and a["verdict"] == "regression" else ""
        c[2].markdown(f"{VERDICT_WORDS.get(a['verdict'], a['verdict'])}: {a['cases']} case(s)"
                      f"{', worst ' + worst if worst else ''}")
        c[3].markdown(f"{_commit(repo, a['last_good'])}..{_commit(repo, a['first_bad'])}")
        ui.page_link(ctx, "history", "History", where=c[4], variant=a["variant"],
                     case=a["worst_case"], gpu=a["gpu_model_key"])
        if a["base_run_id"] is not None and pd.notna(a["base_run_id"]):
            ui.page_link(ctx, "compare", "Compare", where=c[5], base=int(a["base_run_id"]),
                         new=int(a["run_id"]))


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

    alerts(ctx)

    latest = ctx.q("latest_runs")
    ids = tuple(int(i) for i in latest["id"])
    counts = ctx.q("status_counts", ids)
    flags = ctx.q("flagged_in_runs", ids)

    st.subheader("Latest run per grid, GPU and branch")
    table = latest.rename(columns={"id": "run_id"}).copy()
    table["grid"] = table["grids"].map(ui.grid_name)
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
    tables.show(
        ctx, table[["run", "grid", "gpu_model_key", "branch", "commit", "created_at",
                    "regressions flagged", "passed", "failed", "skipped",
                    "crashed/timeout/error/invalid"]],
        key="latest_runs", links=["run"], hide_index=True,
        column_config={"gpu_model_key": "GPU"})

    st.subheader("Best TFLOP/s per variant and grid (passing cases of the latest runs)")
    best = ctx.q("best_tflops", ids)
    if best.empty:
        st.info("No passing timed results in the latest runs.")
    else:
        grid_of = dict(zip(latest["id"], table["grid"], strict=True))
        gpu_of = dict(zip(latest["id"], latest["gpu_model_key"], strict=True))
        best = best.assign(column=best["run_id"].map(
            lambda r: f"{gpu_of[r]} · {grid_of[r]}"))
        wide = best.pivot_table(index="variant", columns="column", values="best_tflops",
                                aggfunc="max")
        # The timing grids first (a smoke or decode best is not a variant's speed).
        order = sorted(wide.columns, key=lambda c: (not c.endswith("perf"), c))
        wide = wide[order]
        st.dataframe(wide.sort_values(order[0], ascending=False).round(1))

    st.subheader("Flagged in the latest runs")
    if flags.empty:
        st.success("No regression, correctness regression or precision drift in the latest runs.")
    else:
        st.error(f"{len(flags)} flagged verdict(s) in the latest runs.")
        grouped = (flags.groupby(["gpu_model_key", "variant", "verdict", "run_id"],
                                 as_index=False)
                   .agg(cases=("case_id", "size"), worst_ratio=("ratio", "max")))
        grouped.insert(0, "run", grouped["run_id"].map(ui.run_href))
        tables.show(ctx, grouped.drop(columns="run_id"), key="latest_flagged", links=["run"],
                    hide_index=True, column_config={"gpu_model_key": "GPU"})
        with st.expander("Every flagged case: commit range, commits, history"):
            flag_list.show(ctx, flags, key="latest_flag_list")

