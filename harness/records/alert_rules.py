"""How verdicts and results move an alert (harness.records.alerts): the levels a flagged
verdict gives each case, adding flags to an alert, a further step on top of one, and
whether a later run's results hold the alert's level or are back at the level before.
Plain functions of an `AlertRow` and the verdicts; no session here."""

from __future__ import annotations

import math
from typing import Any

from harness.records.db.models import AlertRow, utcnow

DEFAULT_THRESHOLD = 0.02  # compare.Policy.threshold, where a verdict names none


def step_levels(v: Any, kind: str) -> tuple[float, float, float] | None:
    """(before, after, ratio) of one flagged verdict: median ms for a timing step (the
    step's own ratio where the step search found it), the error ratio for a drift."""
    if kind == "timing":
        step = v.detail.get("step") or {}
        ratio = step.get("ratio") or v.ratio
        after = v.new_median_ms
        if not ratio or not after or ratio <= 0:
            return None
        return after / ratio, after, ratio
    if v.verdict == "precision_drift":
        b, n = v.detail.get("base_err_ratio"), v.detail.get("new_err_ratio")
        if b and n:
            return b, n, n / b
    return None


def absorb(row: AlertRow, flags: list[Any], kind: str) -> None:
    """Add flagged verdicts to an alert: its cases, per-case levels, worst case."""
    levels = dict((row.detail or {}).get("levels") or {})
    cases = list(row.cases or [])
    for v in flags:
        if v.case_id not in cases:
            cases.append(v.case_id)
        lv = step_levels(v, kind)
        if lv is not None and v.case_id not in levels:
            levels[v.case_id] = [lv[0], lv[1]]
        ratio = lv[2] if lv is not None else None
        if v.verdict == "correctness_regression" and row.verdict != "correctness_regression":
            row.verdict, row.worst_ratio, row.worst_case = v.verdict, None, v.case_id
        elif ratio is not None and (row.worst_ratio is None or ratio > row.worst_ratio) \
                and row.verdict == v.verdict:
            row.worst_ratio, row.worst_case = ratio, v.case_id
        elif row.worst_case is None:
            row.worst_case = v.case_id
    row.cases = sorted(cases)
    row.detail = dict(row.detail or {}, levels=levels)


def further(row: AlertRow, v: Any) -> bool:
    """A timing flag beyond the alert's level after by more than its threshold: a
    further step on top of this one."""
    lv = ((row.detail or {}).get("levels") or {}).get(v.case_id)
    if row.kind != "timing" or not lv or not v.new_median_ms:
        return False
    threshold = float(v.detail.get("threshold") or DEFAULT_THRESHOLD)
    return v.new_median_ms > lv[1] * (1.0 + threshold)


def outcome(row: AlertRow, results: dict[str, tuple[str, float | None, float | None]]
             ) -> tuple[int, int]:
    """(held, back): the alert's cases in this run (module doc)."""
    held = back = 0
    levels = (row.detail or {}).get("levels") or {}
    for case_id in row.cases or []:
        got = results.get(case_id)
        if got is None:
            continue
        status, median, err_ratio = got
        if row.verdict == "correctness_regression":
            if status == "passed":
                back += 1
            elif status != "skipped":
                held += 1
            continue
        value = median if row.kind == "timing" else err_ratio
        lv = levels.get(case_id)
        if status != "passed" or not value or not lv or value <= 0:
            continue  # untimed, skipped or failed: not evidence of either level
        before, after = (math.log(x) for x in lv)
        x = math.log(value)
        if abs(x - before) < abs(x - after):
            back += 1
        else:
            held += 1
    return held, back


def event(row: AlertRow, **what: Any) -> None:
    now = utcnow()
    detail = dict(row.detail or {})
    detail["events"] = [*detail.get("events", []),
                        {"at": now.isoformat(), **{k: v for k, v in what.items() if v}}]
    row.detail, row.updated_at = detail, now


# The runs an alert keeps the ids of (the newest), enough to find a run synced twice.
RUNS_KEPT = 200


def runs_of(row: AlertRow) -> list[int]:
    """The runs that opened, extended or judged the alert (newest last)."""
    detail = row.detail or {}
    return list(detail.get("runs") or []) + (
        [detail["opened_by_run"]] if detail.get("opened_by_run") is not None else [])


def touch(row: AlertRow, run_id: int) -> None:
    runs = [r for r in (row.detail or {}).get("runs") or [] if r != run_id]
    row.detail = dict(row.detail or {}, runs=[*runs, run_id][-RUNS_KEPT:])
