"""The Overview's alert list: every regression in the history, open or recovered, as a
plain function of an Engine (nothing here imports Streamlit).

An alert is one regression event of one candidate (a pass of it) on one GPU model: the
flagged verdicts (timing regression, correctness regression, precision drift) that name
the same commit range. The range is the step's last good..first bad commit when the step
search (harness.records.steps) found it, else the flagged run's base..new commits; a step
confirmed by several runs is still one alert. Its cases, its worst ratio, the run that
first flagged it (the Compare link) and its worst case (the History link).

Open or recovered: a timing alert is recovered once a later run of its worst case on that
GPU model is back nearer the level before (base median) than the level flagged; a
correctness alert once a later run of that case passes. Flagged verdicts are rare, so the
whole list is read through ix_comparisons_verdict; the recovery check reads one series per
alert shown (ix_results_variant_case).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from sqlalchemy import Engine, select
from sqlalchemy.orm import aliased

from harness.dashboard import commits, queries
from harness.dashboard.schema import Comparison, Run

ALERT_COLUMNS = ["state", "gpu_model_key", "variant", "verdict", "cases", "worst_ratio",
                 "worst_case", "last_good", "first_bad", "recovered_at", "run_id",
                 "base_run_id", "created_at", "branch"]
_SEVERITY = {"correctness_regression": 0, "regression": 1, "precision_drift": 2}


def flagged_history(engine: Engine, limit: int = 5000) -> pd.DataFrame:
    """The newest flagged verdicts anywhere (at most `limit`), with both runs' commits and
    the step a verdict names (its detail)."""
    newest = (select(Comparison.id, Comparison.run_id, Comparison.base_run_id,
                     Comparison.created_at, queries.COMPARISON_LABEL, Comparison.case_id,
                     Comparison.verdict, Comparison.ratio, Comparison.detail)
              .with_hint(Comparison, queries._BY_VERDICT, "sqlite")
              .where(Comparison.verdict.in_(queries.FLAGGED))
              .order_by(Comparison.created_at.desc(), Comparison.id.desc())
              .limit(limit).subquery())
    new, base = aliased(Run), aliased(Run)
    stmt = (select(newest.c.run_id, newest.c.base_run_id, newest.c.variant, newest.c.case_id,
                   newest.c.verdict, newest.c.ratio, newest.c.detail, new.gpu_model_key,
                   new.branch, new.commit, new.created_at, base.commit.label("base_commit"))
            .join(new, new.id == newest.c.run_id)
            .outerjoin(base, base.id == newest.c.base_run_id)
            .order_by(newest.c.created_at.desc(), newest.c.id.desc()))
    return queries._frame(engine, stmt)


def _step(detail: Any) -> dict[str, Any]:
    step = detail.get("step") if isinstance(detail, dict) else None
    return step if isinstance(step, dict) else {}


def group(flags: pd.DataFrame) -> pd.DataFrame:
    """One row per alert (module doc), newest first."""
    if flags.empty:
        return pd.DataFrame(columns=ALERT_COLUMNS + ["base_median_ms", "new_median_ms"])
    df = flags.copy()
    steps = df["detail"].map(_step)
    df["last_good"] = [s.get("last_good") or b for s, b in
                       zip(steps, df["base_commit"], strict=True)]
    df["first_bad"] = [s.get("first_bad") or c for s, c in zip(steps, df["commit"], strict=True)]
    df["base_median_ms"] = df["detail"].map(
        lambda d: d.get("base_median_ms") if isinstance(d, dict) else None)
    df["new_median_ms"] = df["detail"].map(
        lambda d: d.get("new_median_ms") if isinstance(d, dict) else None)
    df["sev"] = df["verdict"].map(_SEVERITY).fillna(9)
    df["r"] = df["ratio"].astype(float).fillna(1.0)
    rows = []
    keys = ["gpu_model_key", "variant", "last_good", "first_bad"]
    for key, g in df.groupby(keys, dropna=False, sort=False):
        first = g.sort_values("created_at").iloc[0]  # the run that first flagged it
        worst = g.sort_values(["sev", "r"], ascending=[True, False]).iloc[0]
        rows.append(dict(zip(keys, key, strict=True)) | {
            "verdict": worst["verdict"], "cases": int(g["case_id"].nunique()),
            "worst_ratio": worst["ratio"], "worst_case": worst["case_id"],
            "run_id": int(first["run_id"]),
            "base_run_id": None if pd.isna(first["base_run_id"]) else int(first["base_run_id"]),
            "created_at": first["created_at"], "branch": first["branch"],
            "base_median_ms": worst["base_median_ms"], "new_median_ms": worst["new_median_ms"],
            "last_flagged_at": g["created_at"].max()})
    out = pd.DataFrame(rows).sort_values("created_at", ascending=False, kind="stable")
    return out.reset_index(drop=True)


def _recovered_at(series: pd.DataFrame, alert: pd.Series) -> str | None:
    """The first commit after the alert's run at which its worst case is back (module
    doc), or None while it is open."""
    # Later in commit order, not in time: a re-run of an old commit made afterwards is
    # not a recovery.
    order = commits.commit_order(series)
    at = order.get(alert["first_bad"])
    if at is None:
        after = series[pd.to_datetime(series["created_at"]) >
                       pd.to_datetime(alert["last_flagged_at"])]
    else:
        after = series[series["commit"].map(lambda c: order.get(c, -1) > at)]
        after = after.assign(_pos=after["commit"].map(order)).sort_values(
            ["_pos", "created_at"], kind="stable")
    if alert["verdict"] == "correctness_regression":
        ok = after[after["status"] == "passed"]
        return None if ok.empty else ok.iloc[0]["commit"]
    base, new = alert["base_median_ms"], alert["new_median_ms"]
    if base is None or new is None or not (math.isfinite(base) and math.isfinite(new)):
        return None
    back = after[(after["status"] == "passed") &
                 ((after["median_ms"] - base).abs() < (after["median_ms"] - new).abs())]
    return None if back.empty else back.iloc[0]["commit"]


def alert_list(engine: Engine, shown: int = 40) -> pd.DataFrame:
    """The alerts (newest first, at most `shown`), each open or recovered."""
    alerts = group(flagged_history(engine)).head(shown)
    states, when = [], []
    for _, a in alerts.iterrows():
        series = queries.series(engine, a["variant"], a["worst_case"], a["gpu_model_key"])
        at = _recovered_at(series, a) if len(series) else None
        states.append("recovered" if at else "open")
        when.append(at)
    alerts = alerts.assign(state=states, recovered_at=when)
    if alerts.empty:
        return pd.DataFrame(columns=ALERT_COLUMNS)
    # Open ones first (newest first within each state).
    alerts["_o"] = (alerts["state"] != "open").astype(int)
    return alerts.sort_values(["_o", "created_at"], ascending=[True, False],
                              kind="stable").drop(columns="_o").reset_index(drop=True)
