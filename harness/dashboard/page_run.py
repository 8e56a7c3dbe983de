"""Run: one run's environment, compile resources, failures with their messages, verdicts."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from harness.dashboard import case_filter, ui
from harness.dashboard import flags as flag_list
from harness.dashboard.data import Ctx
from harness.dashboard.queries import FLAGGED

ENV_FIELDS = ("commit", "parent_commit", "branch", "created_at", "source", "origin",
              "trusted", "gpu_name", "gpu_uuid", "gpu_model_key", "driver", "cuda", "torch",
              "cupy", "python", "hostname", "schema_version", "uuid", "record_sha256")
# The most characters of one field a page sends to the browser: a record's free-form
# objects are bounded at import (harness.records.validate.FIELD_LIMITS), but a database
# filled before, or by another tool, may hold anything.
MAX_SHOWN = 20_000
MAX_MESSAGE_SHOWN = 2_000


def clip(text: str, limit: int = MAX_SHOWN) -> str:
    """At most `limit` characters of `text`, saying how many were left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... ({len(text) - limit:,} more characters not shown)"


def render(ctx: Ctx) -> None:
    st.title("Run")
    token = ui.param("run")
    if token is not None:
        run_id = ctx.q("resolve_run", token, None)
        if run_id is None:
            # Shown as code, which Markdown leaves alone unless a backquote closes it.
            shown = clip(token, 80).replace("`", "'").replace("\n", " ")
            st.error(f"Run `{shown}` does not exist in this database (it takes a run id or "
                     "a commit). Pick one of the recent runs below.")
    else:
        run_id = None
    if run_id is None:
        runs = ctx.q("runs_list", None, 300)
        if runs.empty:
            st.info("No runs recorded.")
            return
        labels = {int(r["id"]): ui.run_label(r) for _, r in runs.iterrows()}
        run_id = st.selectbox("Run", list(labels), format_func=labels.get)
        if token is None:
            ui.set_params(run=run_id)
    detail = ctx.q("run_detail", run_id)
    if detail is None:  # deleted between the lookup and now
        st.error(f"Run {run_id} does not exist in this database.")
        return
    st.subheader(f"#{run_id} · {ui.md_escape(ui.short(detail['commit']))} · "
                 f"{ui.md_escape(clip(detail.get('gpu_name') or '?', 200))}")
    if detail.get("trusted") is False:
        # Kept apart (harness.records.db.store.Origin): shown, never a baseline.
        st.warning(f"Untrusted run, stored by {ui.md_escape(clip(str(detail.get('origin')), 300))}"
                   ": it is never a baseline, never in the noise history, and not judged.")

    flt = case_filter.pick(ctx)
    if flt.active:
        per_case = flt.apply(ctx.q("run_case_statuses", run_id))
        counts = {str(k): int(v) for k, v in per_case.groupby("status")["n"].sum().items()}
        st.caption(f"Counts, verdicts and failures of the {flt.label} cases only.")
    else:
        res_counts = ctx.q("status_counts", (run_id,))
        counts = dict(zip(res_counts["status"], res_counts["n"], strict=True))
    cols = st.columns(4)
    cols[0].metric("results", int(sum(counts.values())))
    cols[1].metric("passed", int(counts.get("passed", 0)))
    cols[2].metric("skipped", int(counts.get("skipped", 0)))
    cols[3].metric("not passed", int(sum(v for k, v in counts.items()
                                         if k not in ("passed", "skipped"))))

    # What regressed comes first: it is why a run page is opened from a CI summary.
    comps = flt.apply(ctx.q("run_comparisons", run_id))
    if len(comps):
        st.markdown("#### Verdicts against the baseline")
        # The run it was judged against: the one rule Compare opens on too (a pooled
        # baseline's `missing` verdicts name runs that share no case with this one).
        b = ctx.q("default_base", run_id) if comps["base_run_id"].notna().any() else None
        if b is not None:
            # Page links: they stay in this tab (a Markdown link opens a new one).
            c1, c2, _ = st.columns([1.2, 1.8, 3])
            ui.page_link(ctx, "run", f"Baseline: run #{b}", where=c1, run=b)
            ui.page_link(ctx, "compare", "Compare with the baseline", where=c2, base=b,
                         new=run_id, gpu=detail.get("gpu_model_key") or None)
        st.dataframe(comps["verdict"].value_counts().rename("count"))
        if comps["verdict"].isin(FLAGGED).any():
            st.markdown("#### Flagged verdicts")
            flag_list.show(ctx, flt.apply(ctx.q("flagged_in_runs", (run_id,))), key="run_flags")

    _confirmations(detail)

    st.markdown("#### Environment")
    env = pd.DataFrame({"field": list(ENV_FIELDS),
                        "value": [clip(str(detail.get(f)), 500) if detail.get(f) is not None
                                  else "-" for f in ENV_FIELDS]})
    st.dataframe(env, hide_index=True)
    for field in ("clocks", "calibration", "grids", "env"):
        if detail.get(field):
            with st.expander(field):
                st.code(clip(json.dumps(detail[field], indent=2, sort_keys=True, default=str)),
                        language="json")

    st.markdown("#### Compile resources")
    res = ctx.q("compile_resources", run_id)
    res = res[res[["registers", "spills", "shared_bytes"]].notna().any(axis=1)]
    if res.empty:
        st.caption("No compile report in this run (no CUDA variant, or none compiled).")
    else:
        st.dataframe(res, hide_index=True)

    st.markdown("#### Failures")
    fails = flt.apply(ctx.q("run_failures", run_id))
    if fails.empty:
        st.success("No failed, crashed, timed-out, erroneous or invalid result.")
    else:
        st.error(f"{len(fails)} result(s) did not pass.")
        if "message" in fails:
            fails = fails.assign(message=fails["message"].map(
                lambda m: clip(m, MAX_MESSAGE_SHOWN) if isinstance(m, str) else m))
        st.dataframe(fails, hide_index=True)


def _confirmations(detail: dict) -> None:
    """What the gate timed again before judging (env.ci_confirm,
    harness.runs.gate_confirm): a verdict on the mean of several runs reads differently
    from one on a single run."""
    rows = (detail.get("env") or {}).get("ci_confirm") if isinstance(detail.get("env"), dict) \
        else None
    if not isinstance(rows, list) or not rows:
        return
    st.markdown("#### Timed again before judging")
    table = pd.DataFrame([{
        "candidate": clip(str(r.get("kernel")), 200), "pass": r.get("pass"),
        "why": (f"a step across {clip(str(r['step']), 60)}" if r.get("step") else
                f"read {float(r.get('ratio') or 1) - 1:+.2%} at first"
                + ("" if "p_value" not in r or r.get("p_value") is not None
                   else " on another chip than its baseline's")),
        "more runs": r.get("runs"), "rounds": r.get("rounds") or 1, "cases": r.get("cases"),
        "parent's code": (f"{r.get('parent_cases')} case(s)" if r.get("parent_cases")
                          else clip(str(r.get("parent_not_timed") or "-"), 200)),
        "seconds": r.get("wall_s")} for r in rows if isinstance(r, dict)])
    st.dataframe(table, hide_index=True)
    st.caption("Each suspect's cases timed again in fresh processes (and its parent "
               "commit's code, where the gate could check it out); its verdicts read the "
               "mean of its runs (docs/regressions.md, \"Confirmation runs\").")

