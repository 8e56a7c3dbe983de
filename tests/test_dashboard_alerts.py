"""The regression walk on a committed H200 gate record plus planted steps
(tests/walkdata.py): the Overview's alert list (the stored alerts) names the open fa2_mma
step once, across both GPU models, with its last good..first bad commits and a same-tab
link to the Compare of the runs that show it (one click), whose per-variant table puts
fa2_mma first; a flex_attention slowdown undone by the next commit is withdrawn; History
opens on the open regression; the sidebar's Compare opens on the newest open alert of
the GPU model it shows; the triage form acknowledges a step behind a token.

The database is built once and cached (walkdata.build): the whole committed history
imported per module took longer than the suite's timeout on a loaded 2-core machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import realdata
import walkdata
from sqlalchemy import create_engine
from walkdata import C

# The modules that read the walk database run on one pytest-xdist worker (`make test`'s
# --dist loadgroup): it builds the database once while the other worker runs other tests,
# instead of waiting on the build's lock.
pytestmark = pytest.mark.xdist_group("walk")

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest


@pytest.fixture(scope="module")
def walk(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return walkdata.build(tmp_path_factory.mktemp("walk"),
                          walkdata.cache_dir(request.config, tmp_path_factory))


app = realdata.dashboard_app


def _rows(url: str, **filters):  # noqa: ANN202 - a DataFrame
    from harness.dashboard import alerts

    engine = create_engine(url)
    try:
        return alerts.alert_list(engine, 40, **filters)
    finally:
        engine.dispose()


def _ids(url: str) -> dict[str, int]:
    rows = realdata.sql(url, 'SELECT "commit", id, gpu_model_key FROM runs')
    return {c: i for c, i, g in rows if g == "nvidia-h200"}


def test_alert_list_one_row_per_step_across_gpus(walk: str) -> None:
    rows = _rows(walk)
    mma = rows[(rows["variant"] == "fa2_mma") & (rows["first_bad"] == C[1])]
    assert len(mma) == 1, rows[["variant", "first_bad", "state", "gpus"]]
    a = mma.iloc[0]
    assert a["state"] == "open" and a["last_good"] == C[0]
    assert sorted(a["gpus"]) == ["nvidia-h100-80gb-hbm3", "nvidia-h200"] and len(a["ids"]) == 2
    # Of the 16 cases stepped by 5%, those past the 5% bar of a case with no run-to-run
    # history yet (harness.records.noise.NO_HISTORY_CHANGE).
    assert 8 <= a["cases"] <= 16 and a["worst_ratio"] == pytest.approx(1.05, rel=0.01)
    flex = rows[(rows["variant"] == "flex_attention") & (rows["first_bad"] == C[0])]
    assert len(flex) == 1 and flex.iloc[0]["state"] == "withdrawn"
    # The team's first, open before closed; the yardstick's apart.
    assert list(rows["owned"]) == sorted(rows["owned"], reverse=True)
    assert list(_rows(walk, owned=False)["variant"]) == ["sdpa_flash"]
    assert set(_rows(walk, state=("withdrawn",))["variant"]) == {"flex_attention"}
    on_h100 = _rows(walk, gpu="nvidia-h100-80gb-hbm3")
    assert list(on_h100["variant"]) == ["fa2_mma"]  # the row keeps its H200 alert too
    assert len(on_h100.iloc[0]["gpus"]) == 2


def _links(at: AppTest) -> list[tuple[str, str, dict[str, str]]]:
    from urllib.parse import parse_qsl

    out = []
    for el in at.get("page_link"):
        p = el.proto
        out.append((p.label, p.page, dict(parse_qsl(p.query_string))))
    return out


def test_walk_overview_to_compare_in_one_click(walk: str, monkeypatch) -> None:
    at = app(walk, monkeypatch, alert_state="all")
    text = "\n".join(str(m.value) for m in at.markdown)
    assert f"{C[0][:10]}" in text and f"{C[1][:10]}" in text
    assert f"{realdata.REPO_URL}/commit/{C[1]}" in text  # the first bad commit, linked
    assert "nvidia\\-h100\\-80gb\\-hbm3, nvidia\\-h200" in text or \
        "nvidia\\-h200, nvidia\\-h100\\-80gb\\-hbm3" in text
    # The latest runs count the team's open alerts of their GPU model (the H200's gate
    # run at C3 flags nothing pairwise, yet fa2_mma's step is open there).
    latest = next(d.value for d in at.dataframe if "open alerts" in d.value.columns)
    assert set(latest["open alerts"]) == {1}
    codes = [c.value for c in at.code]
    mma = _rows(walk, variant="fa2_mma").iloc[0]
    assert f"fa-harness bisect --alert {mma['id']}" in codes
    links = _links(at)
    history = [q for label, page, q in links if label == "History"]
    assert next(q for q in history if q["variant"] == "fa2_mma")["gpu"] in mma["gpus"]
    compare = [q for label, page, q in links if label == "Compare"]
    assert {"alert": str(mma["id"])} in compare
    at = app(walk, monkeypatch, page="compare", alert=str(mma["id"]))
    ids = _ids(walk)
    params = {k: str(at.query_params[k]).strip("[]'") for k in ("base", "new")}
    if mma["gpu_model_key"] == "nvidia-h200":
        assert params == {"base": str(ids[C[0]]), "new": str(ids[C[1]])}
    summary = at.dataframe[0].value
    assert summary.iloc[0]["variant"] == "fa2_mma"
    assert "regression" in summary.iloc[0]["verdicts"]
    assert summary.iloc[0]["geomean ratio"] == pytest.approx(1.05, rel=0.01)
    assert any(f"Alert #{mma['id']} (open)" in str(e.value) for e in at.error)


def test_history_opens_on_the_open_regression(walk: str, monkeypatch) -> None:
    newest = _rows(walk, state=("open",)).iloc[0]
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


def test_sidebar_compare_opens_on_the_newest_open_alert(walk: str, monkeypatch) -> None:
    from harness.dashboard import alerts

    at = app(walk, monkeypatch, page="compare")
    engine = create_engine(walk)
    try:  # the pickers open on the H200 (the most runs): its newest live alert
        rows = alerts.stored_alerts(engine, ("open", "acknowledged"), None, "nvidia-h200")
    finally:
        engine.dispose()
    top = rows[rows["owned"]].iloc[0]
    assert top["variant"] == "fa2_mma"  # the team's before the yardstick's
    assert str(at.query_params["alert"]).strip("[]'") == str(top["id"])
    new = int(str(at.query_params["new"]).strip("[]'"))
    base = int(str(at.query_params["base"]).strip("[]'"))
    assert (base, new) == (top["base_run_id"], top["run_id"])
    # The base is the run the flagging verdicts were judged against.
    stored = realdata.sql(walk, "SELECT base_run_id FROM comparisons WHERE run_id = :r "
                                "AND verdict = 'regression' LIMIT 1", r=new)
    assert stored and stored[0][0] == base


def test_triage_acknowledges_behind_a_token(walk: str, monkeypatch, tmp_path: Path) -> None:
    import shutil

    from harness.records.alerts import get_alert
    from harness.records.db.engine import make_engine
    from harness.submissions.tokens import create_token

    copy = tmp_path / "triage.sqlite"  # the module's database stays as built
    shutil.copyfile(walk.removeprefix("sqlite:///"), copy)
    url = f"sqlite:///{copy}"
    engine = make_engine(url)
    try:
        _, token = create_token(engine, "ana")
    finally:
        engine.dispose()
    mma = _rows(url, variant="fa2_mma").iloc[0]
    at = app(url, monkeypatch, alert_variant="fa2_mma")
    by_label = {w.label: w for w in at.text_input}
    by_label["Token"].input("fah_wrong")
    _submit(at)
    assert any("Not changed" in str(e.value) for e in at.error)
    assert get_alert(url, mma["ids"][0]).state == "open"
    by_label = {w.label: w for w in at.text_input}
    by_label["Token"].input(token)
    next(r for r in at.radio if r.label == "Action").set_value("acknowledge")
    _submit(at)
    assert not at.exception
    for i in mma["ids"]:  # every GPU model's alert of the step
        got = get_alert(url, i)
        assert (got.state, got.who) == ("acknowledged", "ana")
    assert any("acknowledged by ana" in str(s.value) for s in at.success)


def _submit(at: AppTest) -> None:
    button = next(b for b in at.button if b.label == "Apply")
    button.click()
    at.run()
