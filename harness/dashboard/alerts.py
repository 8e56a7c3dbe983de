"""The Overview's alert list: the stored alerts (harness.records.alerts, the table the
gate's summary lists too), as plain functions of an Engine (nothing here imports
Streamlit).

An alert is one step of one candidate (a pass of it) on one GPU model, from the commit it
began at, with a life: open, acknowledged, accepted as expected, recovered (undone after
runs confirmed it) or withdrawn (one run's noise). The list groups alerts of the same
step across GPU models, one row per (candidate, kind, first bad commit) naming the GPU
models, because a commit that slows a kernel on an H200 most often slows it on an H100 too,
and it is one thing to triage. Each row keeps the ids of its alerts (the triage actions
and `fa-harness bisect --alert ID` work per alert), its worst ratio and case, and the runs
that show the step (Compare's base and new).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from sqlalchemy import Engine

from harness.records import alerts as records_alerts

ALERT_COLUMNS = ["id", "ids", "state", "states", "gpus", "gpu_model_key", "variant", "owned",
                 "kind", "verdict", "cases", "worst_ratio", "worst_case", "last_good",
                 "first_bad", "run_id", "base_run_id", "created_at", "updated_at", "who",
                 "reason", "link", "culprit", "bisect", "branch"]
STATES = records_alerts.STATE_ORDER


def _row(a: records_alerts.Alert) -> dict[str, Any]:
    d = a.detail or {}
    return {"id": a.id, "state": a.state, "gpu_model_key": a.gpu_model_key,
            "variant": a.label, "owned": a.owned, "kind": a.kind, "verdict": a.verdict,
            "cases": len(a.cases), "case_ids": list(a.cases), "worst_ratio": a.worst_ratio,
            "worst_case": a.worst_case, "last_good": a.last_good_commit,
            "first_bad": a.first_bad_commit, "run_id": d.get("new_run_id") or a.first_run_id,
            "base_run_id": d.get("base_run_id"), "created_at": a.created_at,
            "updated_at": a.updated_at, "who": a.who, "reason": a.reason, "link": a.link,
            "culprit": a.culprit_commit, "bisect": a.bisect_command,
            "branch": d.get("branch")}


def stored_alerts(engine: Engine, state: Sequence[str] | None = None,
                  owned: bool | None = None, gpu: str | None = None,
                  variant: str | None = None) -> pd.DataFrame:
    """One row per stored alert (per GPU model), by state then newest first. A database
    not yet upgraded to the alerts table (migration 0006) has none: the dashboard reads
    and never migrates (`fa-harness db upgrade` does)."""
    from sqlalchemy import inspect

    if not inspect(engine).has_table("alerts"):
        rows = []
    else:
        rows = [_row(a) for a in records_alerts.list_alerts(
            engine, state=list(state) if state else None, owned=owned, gpu_model_key=gpu,
            variant=variant)]
    return pd.DataFrame(rows) if rows else pd.DataFrame(
        columns=[c for c in ALERT_COLUMNS if c not in ("ids", "states", "gpus")])


def group(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per step across GPU models (module doc): the most pressing state of its
    alerts (open before acknowledged before accepted ...), the worst ratio, the GPU
    models by name. The team's first, then by state, newest first."""
    if rows.empty:
        return pd.DataFrame(columns=ALERT_COLUMNS)
    out = []
    keys = ["variant", "kind", "first_bad"]
    for _, g in rows.groupby(keys, dropna=False, sort=False):
        g = g.assign(_s=g["state"].map(STATES)).sort_values(["_s", "id"])
        top = g.iloc[0]
        worst = g.sort_values("worst_ratio", ascending=False, na_position="last").iloc[0]
        out.append({**{c: top[c] for c in g.columns if c in ALERT_COLUMNS},
                    "ids": [int(i) for i in g["id"]],
                    "states": list(g["state"]),
                    "gpus": list(g["gpu_model_key"]),
                    "owned": bool(g["owned"].any()),
                    "cases": int(max(len(set(c)) for c in g["case_ids"])),
                    "worst_ratio": worst["worst_ratio"], "worst_case": worst["worst_case"],
                    "created_at": g["created_at"].min()})
    df = pd.DataFrame(out)
    df["_o"] = (~df["owned"]).astype(int)
    df["_s"] = df["state"].map(STATES)
    df["_t"] = pd.to_datetime(df["created_at"], utc=True)
    df = df.sort_values(["_o", "_s", "_t"], ascending=[True, True, False], kind="stable")
    return df.drop(columns=["_o", "_s", "_t"])[ALERT_COLUMNS].reset_index(drop=True)


def alert_list(engine: Engine, shown: int = 40, state: Sequence[str] | None = None,
               owned: bool | None = None, gpu: str | None = None,
               variant: str | None = None) -> pd.DataFrame:
    """The alerts grouped per step (at most `shown` rows), filtered by state, owned
    (True: the team's; False: the yardsticks'), GPU model and candidate label."""
    rows = stored_alerts(engine, tuple(state) if state else None, owned, None, variant)
    if gpu is not None and len(rows):
        # A step shown on a GPU keeps its other GPU models in the row.
        steps = set(zip(rows.loc[rows["gpu_model_key"] == gpu, "variant"],
                        rows.loc[rows["gpu_model_key"] == gpu, "first_bad"], strict=True))
        rows = rows[[(v, f) in steps for v, f in
                     zip(rows["variant"], rows["first_bad"], strict=True)]]
    return group(rows).head(shown)


def alert_detail(engine: Engine, alert_id: int) -> dict[str, Any] | None:
    """One alert as a dict (Compare's `?alert=`), None when there is none by that id."""
    try:
        return _row(records_alerts.get_alert(engine, int(alert_id)))
    except (records_alerts.AlertError, ValueError):
        return None


def open_by_gpu(engine: Engine) -> pd.DataFrame:
    """Per GPU model the open and acknowledged alerts (the gate summary's list): the
    Overview's latest runs count them beside each run's own flagged verdicts."""
    rows = stored_alerts(engine, ("open", "acknowledged"))
    if rows.empty:
        return rows
    return rows.sort_values(["owned", "id"], ascending=[False, False], kind="stable")
