"""Alerts with a life (harness.records.alerts) on a committed H200 gate record plus planted
steps (tests/walkdata.py): a 5% fa2_mma step is one alert from its first bad commit, not
one per later commit; one run's noise is withdrawn, a step undone after it was confirmed
is recovered; acknowledge and accept are stored; a yardstick's alert never fails the gate,
and the gate's summary lists the open alerts the dashboard's Overview lists."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import realdata
import walkdata
from walkdata import C

from harness.records.alerts import (
    AlertError,
    get_alert,
    list_alerts,
    open_alerts,
    set_culprit,
    set_state,
)

# The modules that read the walk database run on one pytest-xdist worker (`make test`'s
# --dist loadgroup): it builds the database once while the other worker runs other tests,
# instead of waiting on the build's lock.
pytestmark = pytest.mark.xdist_group("walk")

H200 = "nvidia-h200"


@pytest.fixture(scope="module")
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    url = walkdata.build(tmp_path_factory.mktemp("walk"), walkdata.cache_dir(request.config, tmp_path_factory))
    return Path(url.removeprefix("sqlite:///"))


@pytest.fixture
def walk(built: Path, tmp_path: Path) -> str:
    """A fresh copy of the walk database (the tests below change it)."""
    shutil.copyfile(built, tmp_path / "walk.sqlite")
    return f"sqlite:///{tmp_path / 'walk.sqlite'}"


def _db(url: str):  # noqa: ANN202 - a Database
    from harness.records.db import open_db

    return open_db(url)


def test_a_step_is_one_alert_from_its_first_bad_commit(walk: str) -> None:
    with _db(walk) as db:
        mma = list_alerts(db, variant="fa2_mma", gpu_model_key=H200)
        flex = list_alerts(db, variant="flex_attention", gpu_model_key=H200)
        flash = list_alerts(db, variant="sdpa_flash")
    # Three runs flagged or held the fa2_mma step (C1, C2, C3): one alert.
    assert len(mma) == 1, mma
    a = mma[0]
    assert (a.state, a.kind, a.owned) == ("open", "timing", True)
    assert (a.last_good_commit, a.first_bad_commit) == (C[0], C[1])
    assert a.confirmations == 2 and a.last_run_id > a.first_run_id
    # The walk's history is short: a case whose run-to-run spread is not known yet counts
    # only beyond 5% (harness.records.noise.NO_HISTORY_CHANGE), so the alert names the
    # cases of the 16 whose 5% step measured past that bar, not every one of them.
    assert 8 <= len(a.cases) <= 16 and a.worst_ratio == pytest.approx(1.05, rel=0.005)
    assert a.bisect_command == f"fa-harness bisect --alert {a.id}" and a.culprit_commit is None
    # flex_attention slower at C0 only: back at C1 before any run confirmed it.
    assert [f.state for f in flex] == ["withdrawn"]
    # sdpa_flash is a peer: its alert is a yardstick's.
    assert [(f.owned, f.first_bad_commit, f.state) for f in flash] == [(False, C[2], "open")]


def test_acknowledge_accept_reopen_and_the_culprit_are_stored(walk: str) -> None:
    with _db(walk) as db:
        a = list_alerts(db, variant="fa2_mma", gpu_model_key=H200)[0]
        set_state(db, a.id, "acknowledged", who="ana")
        got = get_alert(db, a.id)
        assert (got.state, got.who) == ("acknowledged", "ana")
        with pytest.raises(AlertError, match="reason"):
            set_state(db, a.id, "accepted", who="ana")
        with pytest.raises(AlertError, match="a person sets"):
            set_state(db, a.id, "recovered", who="ana")
        link = "https://github.com/example/fa-harness/pull/7"
        set_state(db, a.id, "accepted", who="bo", reason="more registers for d256", link=link)
        got = get_alert(db, a.id)
        assert (got.state, got.who, got.reason, got.link) == (
            "accepted", "bo", "more registers for d256", link)
        assert [e["state"] for e in got.detail["events"]] == ["acknowledged", "accepted"]
        assert a.id not in [x.id for x in open_alerts(db, H200)]
        assert [x.id for x in list_alerts(db, state="accepted")] == [a.id]
        set_state(db, a.id, "open", who="ana", reason="seen again on the H100")
        assert get_alert(db, a.id).state == "open"
        assert set_culprit(db, a.id, C[1]).culprit_commit == C[1]
        with pytest.raises(AlertError, match="no alert"):
            get_alert(db, 10_000)


def _next(commit: str, parent: str, hours: float, **factors: float):  # noqa: ANN202
    from harness.records.record import RunRecord

    rec = realdata.derive(realdata.load(walkdata.BASE), hours=hours, commit=commit,
                          parent=parent)
    for kernel, factor in factors.items():
        realdata.slower(rec, kernel, factor)
    return RunRecord.from_dict(rec)


def test_the_gate_lists_open_alerts_and_a_yardsticks_never_fails_it(walk: str,
                                                                     tmp_path: Path) -> None:
    from sqlalchemy import create_engine

    from harness.dashboard import alerts as board
    from harness.runs.gate import GateOptions, finish

    opts = GateOptions(db_url=walk, spool_dir=tmp_path / "spool")
    quiet = lambda _line: None  # noqa: E731
    c4 = "e" * 40
    # fa2_mma holds its 5% (no new verdict); sdpa_flash moves 8% more: a yardstick's step.
    out = finish(_next(c4, C[3], 5, fa2_mma=1.05, sdpa_flash=1.08 * 1.08), opts, log=quiet)
    assert out.yardstick_changes and all(v.variant == "sdpa_flash"
                                         for v in out.yardstick_changes)
    assert out.regressions == [] and out.exit_code == 0, out.summary
    owned = [a for a in out.open_alerts if a.owned]
    yard = [a for a in out.open_alerts if not a.owned]
    assert [a.variant for a in owned] == ["fa2_mma"]
    assert {a.variant for a in yard} == {"sdpa_flash"} and len(yard) == 2  # C2's and C4's
    section = out.summary[out.summary.index("### Open alerts on `nvidia-h200`"):]
    assert section.index(f"alert {owned[0].id} ") < section.index("Yardsticks")
    for a in out.open_alerts:
        assert f"`fa-harness bisect --alert {a.id}`" in section
    # The Overview lists the same open alerts of this GPU model (one source: the table).
    engine = create_engine(walk)
    try:
        rows = board.alert_list(engine)
    finally:
        engine.dispose()
    live = rows[rows["state"].isin(["open", "acknowledged"])]
    shown = {i for ids, gpus in zip(live["ids"], live["gpus"], strict=True)
             for i in ids}
    assert {a.id for a in out.open_alerts} <= shown
    # fa2_mma back at its old level: the confirmed step is recovered, not withdrawn.
    out = finish(_next("f" * 40, c4, 6, sdpa_flash=1.08 * 1.08), opts, log=quiet)
    assert out.exit_code == 0, out.summary
    with _db(walk) as db:
        assert [a.state for a in list_alerts(db, variant="fa2_mma", gpu_model_key=H200)] \
            == ["recovered"]


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'alerts.sqlite'}"
    return request.getfixturevalue("pg_url")


def test_the_life_of_an_alert_through_the_gate(db_url: str, tmp_path: Path) -> None:
    """On both backends, through the gate's own finish: a step opens one alert, a commit
    holding its level confirms it, a commit back at the old level recovers it; a
    yardstick's slowdown undone by the next commit is withdrawn and never failed the
    gate; a run synced twice changes nothing."""
    from harness.records.alerts import sync_alerts
    from harness.records.synthetic import make_record, specs_for
    from harness.runs.gate import GateOptions, finish

    opts = GateOptions(db_url=db_url, spool_dir=tmp_path / "spool")
    commits = [f"{i:x}" * 40 for i in range(1, 7)]

    def run(i: int, commit: str | None = None, parent: str | None = None,
            branch: str = "main", **slower: float):  # noqa: ANN202 - a GateOutcome
        specs = specs_for(kernels=("mine", "peer"))
        for s in specs:
            s.median_ms *= slower.get(s.kernel, 1.0)
        rec = make_record(specs, seed=i, commit=commit or commits[i], branch=branch,
                          parent=parent or (commits[i - 1] if i else None), minutes=i)
        rec.kernels["peer"]["kind"] = "peer"
        return finish(rec, opts, log=lambda _line: None)

    assert run(0).exit_code == 0
    out = run(1, mine=1.10, peer=1.10)
    assert out.exit_code == 1 and {v.variant for v in out.regressions} == {"mine"}
    assert [(a.variant, a.owned) for a in out.open_alerts] == [("mine", True), ("peer", False)]
    first, yard = out.open_alerts
    assert (first.last_good_commit, first.first_bad_commit) == (commits[0], commits[1])
    assert "Yardsticks (reported, never a failure):" in out.summary
    # A pull request's run without the step, and the last good commit run again: neither
    # says anything of main's alert.
    run(10, commit="9" * 40, parent=commits[0], branch="pr")
    run(11, commit=commits[0], parent="8" * 40)
    with _db(db_url) as db:
        assert [get_alert(db, a.id).state for a in (first, yard)] == ["open", "open"]
    # mine holds its level (no new verdict: the same alert, confirmed); the peer is back
    # before any run confirmed it: withdrawn.
    out = run(2, mine=1.10)
    assert out.exit_code == 0 and [a.id for a in out.open_alerts] == [first.id]
    with _db(db_url) as db:
        assert get_alert(db, first.id).confirmations == 1
        assert get_alert(db, yard.id).state == "withdrawn"
    out = run(3)  # back after it was confirmed: recovered
    assert out.open_alerts == []
    with _db(db_url) as db:
        assert get_alert(db, first.id).state == "recovered"
        assert len(list_alerts(db)) == 2
        # The gate's run synced again (a retried job): nothing moves.
        assert sync_alerts(db, out.run_id, out.report, owned=lambda k: k == "mine") == []
        assert [a.state for a in list_alerts(db)] == ["recovered", "withdrawn"]


def test_a_history_judged_before_alerts_gets_them_by_replay(walk: str) -> None:
    """A database upgraded to migration 0006 has verdicts and no alerts: replaying the
    stored verdicts gives the alerts the runs gave as they were judged; twice, the same.
    (The walk's own alerts were synced as it was imported, since the first run judged:
    `backfill` had nothing to replay then but that run.)"""
    from harness.records.alert_replay import backfill, replay_alerts

    def shape(db):  # noqa: ANN001, ANN202
        return sorted((a.gpu_model_key, a.variant, a.state, a.owned, a.first_bad_commit,
                       a.last_good_commit, tuple(a.cases), a.confirmations)
                      for a in list_alerts(db))

    with _db(walk) as db:
        synced = shape(db)
        with db.session() as s:
            from harness.records.db.models import AlertRow

            s.query(AlertRow).delete()
        assert list_alerts(db) == []
        # What the gate and import call before they sync a run: every judged run (the
        # first run of each GPU model has no baseline), once.
        assert backfill(db) == 5
        assert shape(db) == synced
        assert backfill(db) == 0
        replay_alerts(db)
        assert shape(db) == synced
