"""The regression walk on the project's own H200 records plus planted steps: the
Overview's alert list names the open fa2_mma slowdown with its last good..first bad
commits and a same-tab link to the Compare of the runs that flagged it (one click), whose
per-variant table puts fa2_mma first; a flex_attention slowdown undone by the next commit
is listed as recovered at that commit; History opens on the open regression."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
import realdata
from sqlalchemy import create_engine

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest
BASE = realdata.RESULTS / "h200-20261201T195739Z-ci-warm.json"
C = [f"{i:x}" * 40 for i in (10, 11, 12, 13)]  # four commits after the newest gate run


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("walk")
    url = realdata.fa_import(f"sqlite:///{d / 'walk.sqlite'}", realdata.RESULTS)
    base = realdata.load(BASE)
    # After every committed record: the planted commits are the newest of the history.
    newest = max(realdata.load(p)["created_at"] for p in realdata.RESULTS.glob("h200-*.json"))
    lag = (_t(newest) - _t(base["created_at"])).total_seconds() / 3600
    records, parent = [], base["commit"]
    for i, commit in enumerate(C):
        rec = realdata.derive(base, hours=lag + 1 + i, commit=commit, parent=parent)
        if i >= 1:
            realdata.slower(rec, "fa2_mma", 1.05)  # from C[1] on
        if i == 0:
            realdata.slower(rec, "flex_attention", 1.10)  # C[0] only: back at C[1]
        rec["env"] = dict(rec.get("env") or {}, repository_url=realdata.REPO_URL)
        records.append(rec)
        parent = commit
    return realdata.fa_import(url, realdata.write(records, d / "planted"))


def _t(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


app = realdata.dashboard_app


def test_alert_list_open_and_recovered(walk: str) -> None:
    from harness.dashboard import alerts

    engine = create_engine(walk)
    try:
        rows = alerts.alert_list(engine)
    finally:
        engine.dispose()
    mma = rows[(rows["variant"] == "fa2_mma") & (rows["first_bad"] == C[1])]
    assert len(mma) == 1, rows[["variant", "first_bad", "state"]]
    a = mma.iloc[0]
    assert a["state"] == "open" and a["last_good"] == C[0]
    assert a["cases"] >= 8 and a["worst_ratio"] == pytest.approx(1.05, rel=0.01)
    flex = rows[(rows["variant"] == "flex_attention") & (rows["first_bad"] == C[0])]
    assert len(flex) == 1 and flex.iloc[0]["state"] == "recovered"
    assert flex.iloc[0]["recovered_at"] == C[1]
    # Open alerts first.
    states = list(rows["state"])
    assert states == sorted(states, key=lambda s: s != "open")


def _links(at: AppTest) -> list[tuple[str, str, dict[str, str]]]:
    from urllib.parse import parse_qsl

    out = []
    for el in at.get("page_link"):
        p = el.proto
        out.append((p.label, p.page, dict(parse_qsl(p.query_string))))
    return out


def test_walk_overview_to_compare_in_one_click(walk: str, monkeypatch) -> None:
    at = app(walk, monkeypatch)
    text = "\n".join(str(m.value) for m in at.markdown)
    assert f"{C[0][:10]}" in text and f"{C[1][:10]}" in text
    assert f"{realdata.REPO_URL}/commit/{C[1]}" in text  # the first bad commit, linked
    links = _links(at)
    compare = [q for label, page, q in links if label == "Compare"]
    history = [q for label, page, q in links if label == "History"]
    assert compare and history
    first = next(q for q in history if q["variant"] == "fa2_mma")
    assert first["gpu"] == "nvidia-h200"
    # The Compare link of the fa2_mma alert: the runs of C[0] and C[1].
    engine = create_engine(walk)
    try:
        with engine.connect() as conn:
            from sqlalchemy import text as sql

            ids = dict(conn.execute(sql('SELECT "commit", id FROM runs WHERE "commit" IN '
                                        "(:a, :b)"), {"a": C[0], "b": C[1]}).all())
    finally:
        engine.dispose()
    assert {"base": str(ids[C[0]]), "new": str(ids[C[1]])} in compare
    at = app(walk, monkeypatch, page="compare", base=str(ids[C[0]]), new=str(ids[C[1]]))
    summary = at.dataframe[0].value
    assert summary.iloc[0]["variant"] == "fa2_mma"
    assert "regression" in summary.iloc[0]["verdicts"]
    assert summary.iloc[0]["geomean ratio"] == pytest.approx(1.05, rel=0.01)


def test_history_opens_on_the_open_regression(walk: str, monkeypatch) -> None:
    from harness.dashboard import alerts

    engine = create_engine(walk)
    try:
        rows = alerts.alert_list(engine)
    finally:
        engine.dispose()
    # The newest open alert: a planted one or one of the real records' own (the committed
    # H200 history has open regressions of its own, a decode case of sdpa_cudnn among them).
    newest = rows[rows["state"] == "open"].iloc[0]
    at = app(walk, monkeypatch, page="history")
    variants = next(w for w in at.multiselect if w.label == "Variants")
    assert variants.value[0] == newest["variant"]
    assert f"{newest['variant']} on " in at.subheader[0].value
    flagged = at.dataframe[0].value
    assert "regression" in set(flagged["verdict"])
    # Its Compare, in this tab: the table's compare cell, selected as a click does.
    row = max(i for i, c in enumerate(flagged["compare"]) if isinstance(c, str))
    base, new = flagged.iloc[row]["compare"].split(" vs ")
    at.session_state[at.dataframe[0].key] = {"selection": {"cells": [(row, "compare")]}}
    at.run()
    assert not at.exception and at.title[0].value == "Compare"
    assert [str(at.query_params[k]).strip("[]'") for k in ("base", "new")] == [base, new]


def test_compare_opens_on_the_stored_baseline(walk: str, monkeypatch) -> None:
    at = app(walk, monkeypatch, page="compare")
    base, new = (int(at.query_params[k][0] if isinstance(at.query_params[k], list)
                     else at.query_params[k]) for k in ("base", "new"))
    engine = create_engine(walk)
    try:
        with engine.connect() as conn:
            from sqlalchemy import text as sql

            stored = conn.execute(sql("SELECT base_run_id FROM comparisons WHERE run_id = :r "
                                      "GROUP BY base_run_id ORDER BY COUNT(*) DESC LIMIT 1"),
                                  {"r": new}).scalar()
            grids = conn.execute(sql("SELECT grids FROM runs WHERE id IN (:a, :b)"),
                                 {"a": base, "b": new}).scalars().all()
    finally:
        engine.dispose()
    assert base == stored
    assert len({json.dumps(json.loads(g) if isinstance(g, str) else g) for g in grids}) == 1
