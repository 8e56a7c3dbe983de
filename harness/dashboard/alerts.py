"""The Overview's alert list: every regression in the history, open or recovered, as a
plain function of an Engine (nothing here imports Streamlit).

An alert is one regression event of one candidate (a pass of it) on one GPU model: the
flagged verdicts (timing regression, correctness regression, precision drift) that name
the same first bad commit. That commit is the step's first bad one when the step search
(harness.records.steps) found it, else the flagged run's new commit; a step confirmed by
several runs is still one alert, and so is a slowdown that one run flagged pairwise on
some cases and the step search later found on others (its range on those cases may
reach further back: the alert shows the range of the run that first flagged it). Its cases, its worst ratio, the run that
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
from sqlalchemy import Connection, Engine, select
from sqlalchemy.orm import aliased

from harness.dashboard import commits, queries
from harness.dashboard.schema import CaseRow, Comparison, Result, Run, Variant, rarely

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
              .where(rarely(engine, Comparison.verdict.in_(queries.FLAGGED)))
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
    keys = ["gpu_model_key", "variant", "first_bad"]
    # Whole-frame sorts, one row kept per alert: the flagged history holds thousands of
    # verdicts, and a sort per alert cost a first History or Overview a fifth of a second.
    df["_alert"] = df.groupby(keys, dropna=False, sort=False).ngroup()
    first = (df.sort_values("created_at", kind="stable")  # the run that first flagged it
             .drop_duplicates("_alert").set_index("_alert").sort_index())
    worst = (df.sort_values(["sev", "r"], ascending=[True, False], kind="stable")
             .drop_duplicates("_alert").set_index("_alert").sort_index())
    out = first[keys].assign(
        last_good=first["last_good"], verdict=worst["verdict"], cases=df.groupby("_alert")["case_id"].nunique(),
        worst_ratio=worst["ratio"], worst_case=worst["case_id"],
        run_id=first["run_id"].astype(int),
        base_run_id=[None if pd.isna(b) else int(b) for b in first["base_run_id"]],
        created_at=first["created_at"], branch=first["branch"],
        base_median_ms=worst["base_median_ms"], new_median_ms=worst["new_median_ms"])
    out = out.sort_values("created_at", ascending=False, kind="stable")
    return out.reset_index(drop=True)


def _points(conn: Connection, variant: str, case_id: str, gpu: str) -> list[tuple]:
    """(commit, parent commit, status, median ms) of one series, oldest run first."""
    name, pass_name = queries.split_label(variant)
    case_pk = select(CaseRow.id).where(CaseRow.case_id == case_id).scalar_subquery()
    stmt = (select(Run.commit, Run.parent_commit, Result.status, Result.median_ms)
            .join(Run, Run.id == Result.run_id)
            .join(Variant, Variant.id == Result.variant_id)
            .where(Variant.name == name, Result.pass_name == pass_name,
                   Result.case_pk == case_pk, Run.gpu_model_key == gpu)
            .order_by(Run.created_at, Run.id))
    return [tuple(r) for r in conn.execute(stmt).all()]


def _recovered_at(points: list[tuple], alert: pd.Series, order: dict[str, int]) -> str | None:
    """The first commit after the alert's first bad one in commit order (`order`:
    harness.dashboard.commits.commit_order of the GPU's runs; a re-run of an old commit
    made later is no recovery) at which its worst case is back (module doc), or None
    while it is open."""
    start = order.get(alert["first_bad"])
    if start is None:
        return None
    later = sorted((p for p in points if order.get(p[0], -1) > start),
                   key=lambda p: order[p[0]])  # stable: a commit's runs oldest first
    base, new = alert["base_median_ms"], alert["new_median_ms"]
    for commit, _parent, status, median in later:
        if status != "passed":
            continue
        if alert["verdict"] == "correctness_regression":
            return commit
        if (base is not None and new is not None and median is not None
                and math.isfinite(base) and math.isfinite(new)
                and abs(median - base) < abs(median - new)):
            return commit
    return None


def _commit_order(conn: Connection, gpu: str) -> dict[str, int]:
    res = conn.execute(select(Run.commit, Run.parent_commit, Run.created_at).where(
        Run.gpu_model_key == gpu))
    return commits.commit_order(pd.DataFrame([tuple(r) for r in res.fetchall()],
                                             columns=list(res.keys())))


def alert_list(engine: Engine, shown: int = 40) -> pd.DataFrame:
    """The alerts (newest first, at most `shown`), each open or recovered."""
    alerts = group(flagged_history(engine)).head(shown)
    states, when = [], []
    # One connection for the few dozen small reads: a connection per read costs a pool
    # checkout, its ping and a transaction, round trips that outweighed the reads.
    with engine.connect() as conn:
        orders = {g: _commit_order(conn, g) for g in set(alerts["gpu_model_key"].dropna())}
        for _, a in alerts.iterrows():
            at = _recovered_at(_points(conn, a["variant"], a["worst_case"],
                                       a["gpu_model_key"]),
                               a, orders.get(a["gpu_model_key"], {}))
            states.append("recovered" if at else "open")
            when.append(at)
    alerts = alerts.assign(state=states, recovered_at=when)
    if alerts.empty:
        return pd.DataFrame(columns=ALERT_COLUMNS)
    # Open ones first (newest first within each state).
    alerts["_o"] = (alerts["state"] != "open").astype(int)
    return alerts.sort_values(["_o", "created_at"], ascending=[True, False],
                              kind="stable").drop(columns="_o").reset_index(drop=True)
