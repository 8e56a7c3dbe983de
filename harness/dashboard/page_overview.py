"""Overview: the alert list first (the stored alerts, harness.records.alerts: one row per
step across GPU models, filtered and triaged in page_overview_triage, with its commit
range, a link each to the History of its worst case and to the Compare of the runs that
show it, and the bisect command), then the latest run of each grid (perf, decode, smoke, ...)
per GPU and branch with its pass/fail counts, and the best TFLOP/s of every variant per
grid."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from harness.dashboard import commits, tables, ui
from harness.dashboard import flags as flag_list
from harness.dashboard import page_overview_triage as triage
from harness.dashboard.data import Ctx

VERDICT_WORDS = {"regression": "slower", "correctness_regression": "now failing",
                 "precision_drift": "precision drift"}


def _commit(repo: str | None, commit: str | None, width: int = 10) -> str:
    short = ui.md_escape(ui.short(commit)[:width])
    url = commits.commit_url(repo, commit) if commit else None
    return f"[`{short}`]({url})" if url else f"`{short}`"


def alerts(ctx: Ctx) -> None:
    st.subheader("Alerts")
    f = triage.filters(ctx)
    rows = ctx.q("alert_list", 40, *f.args)
    triage.actions(ctx, rows)
    if rows.empty:
        st.success("No alert of this choice: no step, correctness regression or precision "
                   "drift." if f.state != () or f.owned is not None else
                   "No regression, correctness regression or precision drift in the history.")
        return
    states = rows["state"].value_counts()
    line = ", ".join(f"{n} {s}" for s, n in states.items()) + f" (newest {len(rows)} shown)"
    (st.error if states.get("open", 0) else st.info)(line)
    urls = ctx.q("repository_urls", tuple(sorted({int(r) for r in rows["run_id"]
                                                  if pd.notna(r)})))
    widths = [1.0, 1.9, 1.8, 1.7, 1.1, 2.3]
    head = st.columns(widths)
    for col, name in zip(head, ("state", "GPUs · candidate", "what", "last good..first bad",
                                "", "bisect (copy)"), strict=True):
        col.caption(name)
    for _, a in rows.iterrows():
        c = st.columns(widths, vertical_alignment="center")
        repo = urls.get(int(a["run_id"])) if pd.notna(a["run_id"]) else None
        c[0].markdown(_state(a))
        yard = "" if a["owned"] else " :gray[(yardstick)]"
        gpus = ", ".join(ui.md_escape(g) for g in a["gpus"])
        c[1].markdown(f"{gpus} · **{ui.md_escape(a['variant'])}**{yard}")
        ratio = a["worst_ratio"]
        worst = f"{ratio:.3f}x" if pd.notna(ratio) and a["verdict"] == "regression" else ""
        c[2].markdown(f"{VERDICT_WORDS.get(a['verdict'], a['verdict'])}: {a['cases']} case(s)"
                      f"{', worst ' + worst if worst else ''}" + _why(a))
        c[3].markdown(f"{_commit(repo, a['last_good'], 7)}..{_commit(repo, a['first_bad'], 7)}")
        # One column for both links, stacked: the bisect command needs the width.
        links = c[4].container(gap=None)
        ui.page_link(ctx, "history", "History", where=links, variant=a["variant"],
                     case=a["worst_case"], gpu=a["gpu_model_key"])
        ui.page_link(ctx, "compare", "Compare", where=links, alert=int(a["id"]))
        # Wrapped where the column is narrow; the copy button copies the whole command.
        c[5].code(a["bisect"], language=None, wrap_lines=True)


def _state(a: pd.Series) -> str:
    """The row's state and who set it (acknowledged, accepted), in a narrow column."""
    color = {"open": "red", "acknowledged": "orange", "accepted": "blue",
             "recovered": "green"}.get(a["state"], "gray")
    text = f":{color}[**{a['state']}**]"
    if a["state"] in ("acknowledged", "accepted") and a["who"]:
        text += f" {ui.md_escape(a['who'])}"
    return text


def _why(a: pd.Series) -> str:
    """Why it was accepted (and the link that explains it), under what it is."""
    if a["state"] != "accepted" or not a["reason"]:
        return ""
    why = ui.md_escape(a["reason"])
    return "  \n:gray[" + (f"[{why}]({a['link']})" if a["link"] else why) + "]"


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
    # A step stays open after the run that flagged it: the runs of its GPU model and
    # branch count it (the team's; a yardstick's never fails a gate) until it is
    # recovered or triaged.
    live = ctx.q("open_by_gpu")
    team = live[live["owned"]] if len(live) else live
    table["open alerts"] = [
        int(((team["gpu_model_key"] == g) & team["branch"].isin([b, None])).sum())
        if len(team) else 0 for g, b in zip(table["gpu_model_key"], table["branch"],
                                            strict=True)]
    table["commit"] = table["commit"].map(ui.short)
    table["run"] = table["run_id"].map(ui.run_href)
    tables.show(
        ctx, table[["run", "grid", "gpu_model_key", "branch", "commit", "created_at",
                    "regressions flagged", "open alerts", "passed", "failed", "skipped",
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
    gpus = set(latest["gpu_model_key"])
    still = live[live["gpu_model_key"].isin(gpus)] if len(live) else live
    if flags.empty and still.empty:
        st.success("No regression, correctness regression or precision drift in the latest "
                   "runs, and no open alert on their GPU models.")
        return
    st.error(f"{len(flags)} flagged verdict(s) in the latest runs; {len(still)} open "
             "alert(s) on their GPU models.")
    if len(still):
        shown = still.assign(since=[f"{ui.short(g)}..{ui.short(b)}" for g, b in
                                    zip(still["last_good"], still["first_bad"], strict=True)],
                             whose=still["owned"].map({True: "team", False: "yardstick"}))
        # The alert's own runs in the link (its label reads "base vs new"), and the alert.
        shown.insert(0, "compare", [
            (ui.compare_href(b, n) + f"&alert={int(i)}") if pd.notna(b) and pd.notna(n)
            else f"./?page=compare&alert={int(i)}"
            for i, b, n in zip(shown["id"], shown["base_run_id"], shown["run_id"],
                               strict=True)])
        tables.show(ctx, shown[["compare", "id", "state", "whose", "gpu_model_key", "variant",
                                "since", "cases", "worst_ratio", "worst_case", "bisect"]],
                    key="latest_open_alerts", links=["compare"], hide_index=True,
                    column_config={"gpu_model_key": "GPU", "since": "last good..first bad",
                                   "compare": ui.COMPARE_LINK,
                                   "worst_ratio": st.column_config.NumberColumn(
                                       "worst ratio", format="%.3f")})
    if len(flags):
        grouped = (flags.groupby(["gpu_model_key", "variant", "verdict", "run_id"],
                                 as_index=False)
                   .agg(cases=("case_id", "size"), worst_ratio=("ratio", "max")))
        grouped.insert(0, "run", grouped["run_id"].map(ui.run_href))
        tables.show(ctx, grouped.drop(columns="run_id"), key="latest_flagged", links=["run"],
                    hide_index=True, column_config={"gpu_model_key": "GPU"})
        with st.expander("Every flagged case: commit range, commits, history"):
            flag_list.show(ctx, flags, key="latest_flag_list")
