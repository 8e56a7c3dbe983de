"""History: one case over commits (first-parent order), for one or several variants and
GPUs, one line per (variant, GPU, grid), with the noise band and the stored verdicts."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from harness.dashboard import case_filter, charts, commits, tables, ui
from harness.dashboard.data import Ctx
from harness.dashboard.queries import FLAGGED

METRICS = {"tflops": "TFLOP/s", "median_ms": "time (ms)"}


def pick_many(label: str, options: list[str], name: str, *, fmt=str, where=st) -> list[str]:
    """A multiselect backed by a comma-separated query parameter (first option when the
    link names none); names the link gives that are not options are reported."""
    wanted = [w.strip() for w in (ui.param(name) or "").split(",") if w.strip()]
    chosen = [w for w in wanted if w in options]
    unknown = [w for w in wanted if w not in options]
    if unknown:
        where.warning(f"`{name}={','.join(unknown)}` from the link is not in this database.")
    chosen = chosen or options[:1]
    picked = where.multiselect(label, options, default=chosen, format_func=fmt)
    ui.set_params(**{name: ",".join(picked)})
    return list(picked)


def _verdicts(ctx: Ctx, variant: str, case_id: str) -> pd.DataFrame:
    """One verdict per run (a flagged one wins over an improvement), with its base run."""
    flags = ctx.q("series_flags", variant, case_id)
    if flags.empty:
        return pd.DataFrame(columns=["verdict", "base_run_id", "ratio"],
                            index=pd.Index([], name="run_id"))
    flags = flags.assign(bad=flags["verdict"].isin(FLAGGED)).sort_values("bad")
    return flags.drop_duplicates("run_id", keep="last").set_index("run_id")[
        ["verdict", "base_run_id", "ratio"]]


def _default_view(ctx: Ctx) -> tuple[str, str, str | None] | None:
    alerts = ctx.q("alert_list", 40)
    open_ = alerts[alerts["state"] == "open"] if len(alerts) else alerts
    if len(open_):
        a = open_.iloc[0]
        return a["variant"], a["worst_case"], a["gpu_model_key"]
    pair = ctx.q("timed_pair")
    return None if pair is None else (pair[0], pair[1], None)


def render(ctx: Ctx) -> None:
    st.title("History")
    variants, cases, names = ctx.q("variant_names"), ctx.q("case_ids"), ctx.q("gpu_names")
    if not (variants and cases and names):
        st.info("No variant, case or GPU recorded yet.")
        return
    # A link may spell the GPU by its reported name (`NVIDIA H200`).
    gpu_param = ui.param("gpu")
    if gpu_param and "," not in gpu_param and gpu_param not in names:
        match = {v.lower(): k for k, v in names.items()}.get(gpu_param.lower()) or (
            ui.gpu_key(gpu_param) if ui.gpu_key(gpu_param) in names else None)
        if match:
            st.query_params["gpu"] = match
    # Without a link naming them, open on the newest open regression (its worst case),
    # else on the newest timed (variant, case) of a kernel under test: it draws. A link
    # naming both needs neither (the alert list is the page's costliest read).
    linked_variants = [w.strip() for w in (ui.param("variant") or "").split(",")]
    linked = ui.param("case") in cases and any(w in variants for w in linked_variants)
    pair = None if linked else _default_view(ctx)
    if pair is not None:
        variants = [pair[0], *(v for v in variants if v != pair[0])]
        cases = [pair[1], *(c for c in cases if c != pair[1])]
        if pair[2] and ui.param("gpu") is None and ui.param("variant") is None:
            st.query_params["gpu"] = pair[2]
    flt = case_filter.pick(ctx)
    if flt.active:
        cases = [c for c in cases if flt.keeps(c)]
        linked = ui.param("case")
        if linked is not None and not flt.keeps(linked) and linked in flt.kinds["case_id"].values:
            # The link's case is in the database, only not of the chosen kinds: a note,
            # not the picker's "not in this database".
            st.caption(f"Case `{linked}` is not of the chosen case kinds ({flt.label}).")
            st.query_params.pop("case", None)
        if not cases:
            st.info(f"No case of the chosen kinds ({flt.label}).")
            return
    c1, c2, c3, c4 = st.columns([2, 3, 2, 1])
    chosen_variants = pick_many("Variants", variants, "variant", where=c1)
    case_id = ui.pick("Case", cases, "case", where=c2)
    gpus = pick_many("GPUs", sorted(names), "gpu", fmt=lambda k: names.get(k) or k, where=c3)
    metric = ui.pick("Metric", list(METRICS), "metric", fmt=METRICS.__getitem__, where=c4)
    branches = ctx.q("branches")
    branch = None
    if len(branches) > 1:
        choice = ui.pick("Branch", ["all", *branches], "branch")
        branch = None if choice == "all" else choice
    if not chosen_variants or not gpus or case_id is None:
        st.info("Pick at least one variant and one GPU.")
        return

    parts = []
    for variant in chosen_variants:
        verdicts = _verdicts(ctx, variant, case_id)
        for gpu in gpus:
            df = ctx.q("series", variant, case_id, gpu, branch)
            if df.empty:
                continue
            df = df.assign(variant=variant, gpu=gpu)
            df["grid"] = df["grids"].map(ui.grid_name)
            df["verdict"] = df["run_id"].map(verdicts["verdict"])
            df["base_run_id"] = df["run_id"].map(verdicts["base_run_id"])
            # The hover's "ratio": the flagged or improved verdict's time ratio.
            df["ratio"] = df["run_id"].map(verdicts["ratio"])
            parts.append(df)
    if not parts:
        st.info(f"No results for {', '.join(chosen_variants)} on {case_id} on "
                f"{', '.join(names.get(g, g) for g in gpus)}.")
        return
    raw = pd.concat(parts, ignore_index=True)
    frame = commits.in_commit_order(charts.history_frame(raw, metric))
    # One line per (variant, GPU): a case timed by a perf run and by a gate's run is one
    # series (the grid is in each point's tooltip).
    frame["series"] = frame["variant"] + " | " + frame["gpu"]
    frame["when"] = pd.to_datetime(frame["created_at"]).dt.strftime("%Y-%m-%d %H:%M UTC")
    frame["run"] = frame["run_id"].map(ui.run_href)
    flagged = frame["verdict"].isin(FLAGGED) & frame["base_run_id"].notna()
    frame["compare"] = None
    frame.loc[flagged, "compare"] = [ui.compare_href(b, n) for b, n in
                                     zip(frame.loc[flagged, "base_run_id"],
                                         frame.loc[flagged, "run_id"], strict=True)]
    # A click on a flagged point opens the Compare of its base and new runs.
    frame["href"] = frame["compare"].where(flagged, frame["run"])
    timed = frame[frame["value"].notna()]
    st.subheader(f"{', '.join(chosen_variants)} on {case_id}")
    if timed.empty:
        st.info("These results carry no timing.")
    else:
        st.altair_chart(charts.history_chart(timed, metric, ""), width="stretch")
        st.caption("In commit order (each run's recorded parent commit; ticks: date of the "
                   "commit's first run and the short commit). One line per variant and GPU, "
                   "across grids (a point's grid is in its tooltip). Band: interquartile range of the samples around the median; dotted: "
                   "best sample. Red: regression verdicts (click: Compare of its base and "
                   "new runs), green: improvements; other points open their run.")
    bad = frame[frame["verdict"].isin(FLAGGED)]
    if len(bad):
        st.subheader(f"Flagged runs ({len(bad)})")
        # A base run is most often a point of this series (same case and GPU): its commit
        # is at hand; only others are read.
        commit_of = dict(zip(frame["run_id"], frame["commit"], strict=True))
        shown = bad.assign(base_commit=bad["base_run_id"].map(
            lambda b: ui.short(commit_of[b] if b in commit_of else
                               (ctx.q("run_detail", int(b)) or {}).get("commit"))
            if pd.notna(b) else "?"))
        shown["commits"] = shown["base_commit"] + ".." + shown["commit_short"]
        tables.show(ctx, shown[["verdict", "commits", "compare", "run", "series", "grid",
                                "when", "value", "status"]],
                    key="history_flagged", links=["compare", "run"], hide_index=True)
    with st.expander(f"All {len(frame)} points"):
        tables.show(ctx, frame[["label", "run", "compare", "series", "grid", "when", "branch",
                                "status", "value", "median_ms", "iqr_ms", "min_ms",
                                "err_ratio", "verdict"]],
                    key="history_points", links=["run", "compare"], hide_index=True)
