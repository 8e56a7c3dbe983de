"""The kinds of case a database holds (memory layout: dense / varlen / paged; sliding
window or not) and the decode roofline's numbers, as plain functions (nothing here imports
Streamlit).

The kinds come from the `cases` table (migration 0004's layout, page_size, full_lengths,
window_left, window_right): it holds one row per case id, a few hundred rows however many
results there are, so reading it whole costs one small query, and every page filters its
own per-run frame by case id in pandas, with no extra join on the results table. A database
not yet upgraded to 0004 has no such columns; it cannot hold a serving case either (storing
one writes them), so its cases are all dense and windowless.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd
from sqlalchemy import Engine, func, inspect, select

from harness.dashboard.schema import CaseRow, Result

# A decode-shaped case: at most this many query rows, so the time is the KV cache's read,
# memory bound. The same bound as harness.runs.plan_order.DECODE_MAX_SEQLEN_Q (the
# dashboard may not import the layers below it; tests/test_dashboard_serving.py holds the
# two equal).
DECODE_MAX_SEQLEN_Q = 16
LAYOUTS = ("dense", "varlen", "paged")
WINDOWS = ("with", "without")
# The axes a candidate must declare to run a case (docs/score-mods.md, docs/fp8.md) and
# the input distributions, as a case id spells them (harness.core.cases.Case.id: one "-"
# token each; tests/test_dashboard_extras.py holds the two together). "plain": none.
EXTRAS: tuple[tuple[str, str], ...] = (
    ("softcap", r"sc\d+(\.\d+)?"), ("alibi", "alibi"), ("sinks", "sink"),
    ("d_v", r"d\d+v\d+"), ("fp8", r"fp8_qkv_[a-z]+"), ("fp8 cache", r"fp8_kv_[a-z]+"),
    ("outliers", "outliers"), ("large", "large"))
PLAIN = "plain"
KIND_COLUMNS = ["case_id", "seqlen_q", "kv_heads", "layout", "page_size", "full_lengths", "window_left",
                "window_right", "windowed", "layout_label", "extras"]
_SERVING = ("layout", "page_size", "full_lengths", "window_left", "window_right")


def layout_label(layout: str, page_size: int, windowed: bool) -> str:
    """How the decode view names a case's memory layout: "contiguous", "paged 64",
    "varlen", with ", window" after it for a sliding window."""
    name = {"dense": "contiguous", "varlen": "varlen"}.get(layout) or (
        f"paged {int(page_size)}" if page_size else str(layout))
    return name + (", window" if windowed else "")


def extras_of(case_id: str) -> tuple[str, ...]:
    """The EXTRAS a case id names, in EXTRAS order; ("plain",) when none."""
    tokens = case_id.split("-")
    got = tuple(name for name, pattern in EXTRAS
                if any(re.fullmatch(pattern, t) for t in tokens))
    return got or (PLAIN,)


def case_kinds(engine: Engine) -> pd.DataFrame:
    """Every case id with its kind: seqlen_q, kv_heads, layout, page_size, full_lengths,
    window_left, window_right, windowed (a side of the window bounded) and layout_label."""
    with engine.connect() as conn:
        have = {c["name"] for c in inspect(conn).get_columns(CaseRow.__tablename__)}
        serving = all(c in have for c in _SERVING)
        cols = [CaseRow.case_id, CaseRow.seqlen_q, CaseRow.kv_heads]
        if serving:
            cols += [getattr(CaseRow, c) for c in _SERVING]
        rows = conn.execute(select(*cols).order_by(CaseRow.case_id)).all()
    frame = pd.DataFrame([tuple(r) for r in rows],
                         columns=["case_id", "seqlen_q", "kv_heads", *(_SERVING if serving else ())])
    if not serving:
        frame = frame.assign(layout="dense", page_size=0, full_lengths=False,
                             window_left=-1, window_right=-1)
    frame["page_size"] = frame["page_size"].fillna(0).astype(int)
    frame["full_lengths"] = frame["full_lengths"].fillna(False).astype(bool)
    frame["windowed"] = (frame["window_left"].fillna(-1).ge(0)
                         | frame["window_right"].fillna(-1).ge(0))
    frame["layout"] = frame["layout"].fillna("dense").astype(str)
    frame["layout_label"] = [layout_label(lay, ps, w) for lay, ps, w in
                             zip(frame["layout"], frame["page_size"], frame["windowed"],
                                 strict=True)]
    frame["extras"] = [extras_of(str(c)) for c in frame["case_id"]]
    return frame[KIND_COLUMNS]


def present_extras(kinds: pd.DataFrame) -> list[str]:
    """The extras (and "plain") the cases of `kinds` hold, plain first, then EXTRAS order."""
    held = {e for row in kinds.get("extras", pd.Series(dtype=object)) for e in row}
    return [e for e in (PLAIN, *(name for name, _ in EXTRAS)) if e in held]


def with_extras(kinds: pd.DataFrame, extras: Sequence[str]) -> set[str]:
    """Case ids with at least one of `extras` ("plain": a case with none)."""
    want = set(extras)
    return {c for c, row in zip(kinds["case_id"], kinds["extras"], strict=True)
            if want & set(row)}


def present(kinds: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The layouts (in LAYOUTS order) and window states ("with", "without") the cases of
    `kinds` hold."""
    layouts = [lay for lay in LAYOUTS if (kinds["layout"] == lay).any()]
    layouts += sorted(set(kinds["layout"]) - set(LAYOUTS))
    windows = [w for w, flag in (("with", True), ("without", False))
               if (kinds["windowed"] == flag).any()]
    return layouts, windows


def chosen_ids(kinds: pd.DataFrame, layouts: Sequence[str], windows: Sequence[str]) -> set[str]:
    """Case ids whose layout is one of `layouts` and whose window state one of `windows`."""
    keep = kinds["layout"].isin(list(layouts)) & kinds["windowed"].map(
        {True: "with", False: "without"}).isin(list(windows))
    return set(kinds.loc[keep, "case_id"])


def run_case_statuses(engine: Engine, run_id: int) -> pd.DataFrame:
    """case_id x status -> count of one run (through ix_results_run; thousands of rows at
    most), for the Run page's counts under a case filter."""
    stmt = (select(CaseRow.case_id, Result.status, func.count().label("n"))
            .select_from(Result).join(CaseRow, CaseRow.id == Result.case_pk)
            .where(Result.run_id == run_id)
            .group_by(CaseRow.case_id, Result.status))
    with engine.connect() as conn:
        res = conn.execute(stmt)
        return pd.DataFrame([tuple(r) for r in res.fetchall()], columns=list(res.keys()))


# --- decode: achieved bandwidth ------------------------------------------------------------

DECODE_COLUMNS = ["variant", "case_id", "layout", "seqlen_k", "dtype", "kv_heads", "bytes",
                  "median_ms", "gbps", "of_copy"]
TABLE_COLUMNS = ["variant", "layout", "cases", "best GB/s", "median GB/s", "best of copy"]


def decode_points(results: pd.DataFrame, kinds: pd.DataFrame, nbytes: pd.Series,
                  copy_gbps: float | None) -> pd.DataFrame:
    """The passing timed decode-shaped results of one run (`results`: run_results; `nbytes`
    the bytes counted for each of its rows) as achieved bandwidth: gbps = bytes / median
    time, of_copy = gbps / the runner's copy ceiling (NaN without calibration)."""
    frame = results.assign(bytes=nbytes.astype("float64"))
    frame = frame[(frame["status"] == "passed") & frame["median_ms"].gt(0)
                  & frame["bytes"].gt(0) & frame["seqlen_q"].le(DECODE_MAX_SEQLEN_Q)]
    frame = frame.merge(kinds[["case_id", "kv_heads", "layout_label"]], on="case_id",
                        how="left")
    frame["layout"] = frame["layout_label"].fillna("contiguous")
    # bytes / (ms * 1e-3) / 1e9 = GB/s
    frame["gbps"] = frame["bytes"] / frame["median_ms"].astype("float64") / 1e6
    frame["of_copy"] = frame["gbps"] / copy_gbps if copy_gbps else np.nan
    return frame[DECODE_COLUMNS].sort_values(["variant", "layout", "seqlen_k", "case_id"],
                                             kind="stable").reset_index(drop=True)


def decode_table(points: pd.DataFrame) -> pd.DataFrame:
    """Per variant x layout: cases, best and median GB/s, best fraction of the copy
    ceiling; the fastest (variant, layout) first."""
    if points.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    table = (points.groupby(["variant", "layout"], as_index=False)
             .agg(cases=("case_id", "size"), best=("gbps", "max"), median=("gbps", "median"),
                  of_copy=("of_copy", "max"))
             .rename(columns={"best": "best GB/s", "median": "median GB/s",
                              "of_copy": "best of copy"}))
    return table.sort_values(["best GB/s"], ascending=False,
                             kind="stable").reset_index(drop=True)[TABLE_COLUMNS]
