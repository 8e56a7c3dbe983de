"""The dashboard: every page under Streamlit's AppTest against a seeded synthetic history,
the query layer against independent SQL, bad input (unreachable, missing, empty database,
unknown run), and the import boundary (no torch, no CuPy, no kernels)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import realdata
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from harness.dashboard import queries, source
from harness.dashboard.schema import Base, Submission
from harness.dashboard.synth import SynthSpec, generate, synth_cases

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "harness" / "dashboard" / "app.py"
SPEC = SynthSpec(commits=12, gpus=2, variants=4, cases=6)
H200 = "NVIDIA H200"

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("dash") / "history.sqlite"
    url = f"sqlite:///{path}"
    engine = create_engine(url)
    generate(engine, SPEC)
    t0 = datetime(2026, 2, 1, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(Submission.__table__.insert(), [
            {"name": "fast_one", "submitter": "ana", "source": "{}", "source_hash": "a",
             "status": "done", "verdict": "scored", "score": 1.42, "created_at": t0,
             "finished_at": t0 + timedelta(minutes=5), "message": None, "failing_cases": None,
             "detail": {"coverage": {"timed": 48, "of": 48}}},
            {"name": "faster_one", "submitter": "bo", "source": "{}", "source_hash": "b",
             "status": "done", "verdict": "scored", "score": 2.10, "created_at": t0,
             "finished_at": t0 + timedelta(minutes=9), "message": None, "failing_cases": None,
             "detail": {"coverage": {"timed": 48, "of": 48}}},
            # The best score, on part of the perf grid only: ranks after full coverage.
            {"name": "easy_cases_only", "submitter": "cy", "source": "{}", "source_hash": "d",
             "status": "done", "verdict": "scored", "score": 9.0, "created_at": t0,
             "finished_at": t0 + timedelta(minutes=7), "message": None, "failing_cases": None,
             "detail": {"coverage": {"timed": 2, "of": 48}}},
            {"name": "stale_cache", "submitter": "eve", "source": "{}", "source_hash": "c",
             "status": "done", "verdict": "incorrect", "score": None, "created_at": t0,
             "finished_at": t0 + timedelta(minutes=2),
             "message": "output cached across calls", "failing_cases": ["b1h1-1x1"],
             "detail": None},
        ])
    engine.dispose()
    return url


app = realdata.dashboard_app


def charts(at: AppTest) -> list:
    return at.get("vega_lite_chart")


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


sql = realdata.sql


def follow(at: AppTest, key: str, row: int, column: str) -> AppTest:
    """Select one cell of table `key` (what a click on it does) and run the app again."""
    at.session_state[key] = {"selection": {"cells": [(row, column)]}}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def table(at: AppTest, key: str):
    return next(d for d in at.dataframe if d.key == key)


def latest_run_ids(url: str) -> list[int]:
    rows = sql(url, "SELECT gpu_model_key, MAX(created_at) FROM runs GROUP BY gpu_model_key")
    ids = []
    for gpu, when in rows:
        ids += [r[0] for r in sql(url, "SELECT id FROM runs WHERE gpu_model_key = :g AND "
                                        "created_at = :w", g=gpu, w=when)]
    return sorted(ids)


# --- pages -------------------------------------------------------------------------------


def test_overview(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(db, monkeypatch)  # no ?page=: the overview is the default
    assert at.title[0].value == "Overview"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["runs"] == str(SPEC.commits * SPEC.gpus)
    assert metrics["GPU models"] == str(SPEC.gpus)
    latest = at.dataframe[0].value
    assert sorted(latest["gpu_model_key"]) == sorted(
        r[0] for r in sql(db, "SELECT DISTINCT gpu_model_key FROM runs"))
    # Pass counts and flags of the latest runs, against independent SQL.
    ids = latest_run_ids(db)
    passed = sql(db, f"SELECT COUNT(*) FROM results WHERE status = 'passed' AND run_id IN "
                     f"({','.join(map(str, ids))})")[0][0]
    assert int(latest["passed"].sum()) == passed
    flagged = sql(db, f"SELECT COUNT(*) FROM comparisons WHERE verdict IN ('regression', "
                      f"'correctness_regression', 'precision_drift') AND run_id IN "
                      f"({','.join(map(str, ids))})")[0][0]
    assert flagged > 0  # the synthetic history plants a regression at the newest commit
    assert int(latest["regressions flagged"].sum()) == flagged
    assert f"{flagged} flagged verdict(s)" in texts(at.error)
    assert int(at.dataframe[2].value["cases"].sum()) == flagged  # grouped by GPU x variant
    assert len(at.dataframe[3].value) == flagged  # every flagged case
    # Best TFLOP/s per variant, per GPU and grid.
    best = at.dataframe[1].value
    want = sql(db, "SELECT MAX(r.tflops) FROM results r JOIN variants v ON v.id = r.variant_id "
                   "WHERE v.name = 'fa2_tc' AND r.status = 'passed' AND r.run_id = :run",
               run=max(ids))[0][0]
    gpu = sql(db, "SELECT gpu_model_key FROM runs WHERE id = :i", i=max(ids))[0][0]
    grid = latest.set_index("run")["grid"][f"run {max(ids)}"]
    assert best.loc["fa2_tc", f"{gpu} · {grid}"] == pytest.approx(want, abs=0.06)


def test_overview_run_cell_opens_the_run_in_this_tab(db: str, monkeypatch) -> None:
    at = app(db, monkeypatch)
    latest = table(at, "latest_runs").value
    row = list(latest["run"]).index(f"run {max(latest_run_ids(db))}")
    follow(at, "latest_runs", row, "run")
    assert at.title[0].value == "Run"
    assert at.query_params["run"] in (str(max(latest_run_ids(db))),
                                      [str(max(latest_run_ids(db)))])
    # A cell outside the link columns selects, and stays on the page.
    at = app(db, monkeypatch)
    follow(at, "latest_runs", 0, "grid")
    assert at.title[0].value == "Overview"


def test_history_series_and_links(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bf16 = next(c.case_id for c in synth_cases(SPEC.cases) if "-bf16-" in c.case_id)
    at = app(db, monkeypatch, page="history", variant="fa2_tc", case=bf16, gpu=H200)
    assert at.title[0].value == "History"
    assert len(charts(at)) == 1
    assert [s.value for s in at.multiselect] == [["fa2_tc"], [H200]]
    assert at.selectbox[0].value == bf16
    points = at.dataframe[-1].value
    assert len(points) == SPEC.commits
    # Every point links to its own run.
    run_ids = [r[0] for r in sql(db, "SELECT id FROM runs WHERE gpu_model_key = :g "
                                     "ORDER BY created_at", g=H200)]
    assert list(points["run"]) == [f"run {i}" for i in run_ids]
    # The planted bf16 step shows as a regression verdict, then an improvement.
    flagged = at.dataframe[0].value
    assert "regression" in set(flagged["verdict"])
    assert {"regression", "improvement"} <= set(points["verdict"].dropna())
    # The URL keeps the selection (deep link).
    assert at.query_params["variant"] == ["fa2_tc"] or at.query_params["variant"] == "fa2_tc"
    # A flagged run's compare cell opens the Compare of its base and new runs, here.
    base, new = (int(x) for x in flagged.iloc[0]["compare"].split(" vs "))
    stored = sql(db, "SELECT base_run_id FROM comparisons WHERE run_id = :n AND variant = "
                     "'fa2_tc' AND case_id = :c", n=new, c=bf16)
    assert stored == [(base,)]
    follow(at, "history_flagged", 0, "compare")
    assert at.title[0].value == "Compare"
    assert {k: at.query_params[k] for k in ("base", "new")} in (
        {"base": str(base), "new": str(new)}, {"base": [str(base)], "new": [str(new)]})
    # A point's run cell opens that run.
    at = app(db, monkeypatch, page="history", variant="fa2_tc", case=bf16, gpu=H200)
    follow(at, "history_points", 3, "run")
    assert at.title[0].value == "Run"
    assert at.query_params["run"] in (str(run_ids[3]), [str(run_ids[3])])


def test_history_time_metric_and_unknown_variant(db: str, monkeypatch) -> None:
    at = app(db, monkeypatch, page="history", variant="no_such_kernel", metric="median_ms")
    assert "no_such_kernel" in texts(at.warning)
    assert len(charts(at)) == 1


def test_compare(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    new, base = [r[0] for r in sql(db, "SELECT id FROM runs WHERE gpu_model_key = :g "
                                       "ORDER BY created_at DESC LIMIT 2", g=H200)]
    at = app(db, monkeypatch, page="compare", gpu=H200, base=str(base), new=str(new))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["pairs"] == str(SPEC.variants * SPEC.cases)
    want = sql(db, "SELECT COUNT(*) FROM comparisons WHERE run_id = :n AND base_run_id = :b "
                   "AND verdict = 'regression'", n=new, b=base)[0][0]
    assert metrics["regressions"] == str(want)
    summary, table = at.dataframe[0].value, at.dataframe[1].value
    assert len(table) == SPEC.variants * SPEC.cases
    assert table.iloc[0]["verdict"] == "regression"  # flagged rows first
    # Per variant first: each variant once, the one with the planted regression on top.
    assert sorted(summary["variant"]) == sorted(set(table["variant"]))
    assert summary.iloc[0]["variant"] == table.iloc[0]["variant"]
    assert "regression" in summary.iloc[0]["verdicts"]
    assert int(summary["pairs"].sum()) == len(table)


def test_compare_by_commit_and_bad_commit(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    commits = [r[0] for r in sql(db, 'SELECT "commit" FROM runs WHERE gpu_model_key = :g '
                                     "ORDER BY created_at DESC LIMIT 2", g=H200)]
    at = app(db, monkeypatch, page="compare", gpu=H200, new=commits[0][:10],
             base=commits[1][:10])
    assert not at.error
    assert [s.value for s in at.selectbox if isinstance(s.value, int)] == [
        r[0] for r in sql(db, "SELECT id FROM runs WHERE gpu_model_key = :g "
                              "ORDER BY created_at DESC LIMIT 2", g=H200)][::-1]
    # Only the new run named: the base is the run its verdicts were judged against.
    at = app(db, monkeypatch, page="compare", gpu=H200, new=commits[0][:10])
    stored = sql(db, "SELECT base_run_id FROM comparisons c JOIN runs r ON r.id = c.run_id "
                     "WHERE r.\"commit\" = :c AND r.gpu_model_key = :g LIMIT 1",
                 c=commits[0], g=H200)[0][0]
    assert at.query_params["base"] in ([str(stored)], str(stored))
    at = app(db, monkeypatch, page="compare", gpu=H200, new="deadbeef99")
    assert "new=deadbeef99" in texts(at.error)


def test_roofline(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(db, monkeypatch, page="roofline", gpu=H200)
    assert len(charts(at)) == 1
    summary = at.dataframe[0].value
    assert set(summary.index) == {"fa2_tc", "fa2_cuda", "fa1_cuda", "naive_cuda"}
    # Nothing may sit above the roof it is measured against.
    assert (summary["best_of_roof"] <= 1.0).all()
    assert "copy 4,240 GB/s" in texts(at.caption)  # the calibration's copy bandwidth is the memory roof


def test_correctness_failure_visible(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, gpu = sql(db, "SELECT r.run_id, runs.gpu_model_key FROM results r "
                          "JOIN runs ON runs.id = r.run_id WHERE r.status = 'failed' "
                          "ORDER BY r.run_id LIMIT 1")[0]
    at = app(db, monkeypatch, page="correctness", gpu=gpu, run=str(run_id))
    metrics = {m.label: m.value for m in at.metric}
    want = sql(db, "SELECT COUNT(*) FROM results WHERE run_id = :r AND status = 'failed'",
               r=run_id)[0][0]
    assert metrics["failed"] == str(want) and want > 0
    assert len(charts(at)) == 2  # the heat map and the error-ratio history
    bad = at.dataframe[0].value
    assert bad["message"].str.contains("base_err").all()


def test_leaderboard_ranks_as_the_cli(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(db, monkeypatch, page="leaderboard")
    ranked = at.dataframe[0].value
    assert list(ranked["name"]) == ["faster_one", "fast_one", "easy_cases_only"]
    assert list(ranked["rank"]) == [1, 2, 3]
    assert list(ranked["coverage"]) == ["48/48", "48/48", "2/48"]
    others = at.dataframe[1].value
    assert list(others["verdict"]) == ["incorrect"]
    # The same order as `fa-harness leaderboard` (the synthetic database has no Alembic
    # revision for the command to check, so its row function is called directly).
    from harness.submissions.ranking import leaderboard_rows

    engine = create_engine(db)
    cli = leaderboard_rows(engine, include_all=True)
    engine.dispose()
    assert [r["name"] for r in cli if r["rank"]] == list(ranked["name"])
    assert [r["name"] for r in cli if not r["rank"]] == list(others["name"])


def test_run_page(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = sql(db, "SELECT run_id FROM results WHERE status = 'failed' LIMIT 1")[0][0]
    at = app(db, monkeypatch, page="run", run=str(run_id))
    tables = [d.value for d in at.dataframe]
    env = next(t for t in tables if "field" in t.columns).set_index("field")["value"]
    assert env["driver"] == "580.159.04"
    resources = next(t for t in tables if "registers" in t.columns)
    assert resources.set_index("variant").loc["fa2_tc", "registers"] == 168
    fails = next(t for t in tables if "message" in t.columns)
    assert len(fails) >= 1 and "base_err" in fails.iloc[0]["message"]


def test_run_page_unknown_run(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(db, monkeypatch, page="run", run="99999")
    assert "Run `99999` does not exist" in texts(at.error)
    at = app(db, monkeypatch, page="run", run="not-a-run")
    assert "Run `not-a-run` does not exist" in texts(at.error)


def test_unknown_page_param(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(db, monkeypatch, page="bogus")
    assert "page=bogus" in texts(at.warning)
    assert at.title[0].value == "Overview"


# --- bad databases -----------------------------------------------------------------------

PAGES = ["overview", "history", "compare", "roofline", "correctness", "leaderboard", "run"]


@pytest.mark.parametrize("page", PAGES)
def test_unreachable_database(page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"  # nothing listens on port 1
    at = app(url, monkeypatch, page=page)
    msg = texts(at.error)
    assert "Cannot read the database" in msg and "127.0.0.1:1" in msg


def test_missing_sqlite_file_is_not_created(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "none.sqlite"
    at = app(f"sqlite:///{path}", monkeypatch)
    assert "fa-harness import --trusted results/" in texts(at.info)
    assert not path.exists()


def test_database_without_tables(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "blank.sqlite"
    create_engine(f"sqlite:///{path}").connect().close()
    at = app(f"sqlite:///{path}", monkeypatch, page="history")
    assert "no fa-harness tables" in texts(at.info)
    assert "fa-harness import --trusted results/" in texts(at.info)


@pytest.mark.parametrize("page", PAGES)
def test_empty_database(page: str, tmp_path: Path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path / 'empty.sqlite'}"
    Base.metadata.create_all(create_engine(url))
    at = app(url, monkeypatch, page=page)
    if page == "leaderboard":  # submissions may exist before any run
        assert "No submissions yet" in texts(at.info)
    else:
        assert "has no runs yet" in texts(at.info)
        assert "fa-harness import --trusted results/" in texts(at.info)


def test_bad_url(monkeypatch: pytest.MonkeyPatch) -> None:
    at = app("nosuchdriver://x/y", monkeypatch)
    assert "nosuchdriver" in texts(at.error)


def test_probe_states(db: str, tmp_path: Path) -> None:
    assert source.probe(db).ok
    assert source.probe(f"sqlite:///{tmp_path / 'x.sqlite'}").state is source.DbState.MISSING
    assert source.redact("postgresql://u:secret@h/db") == "postgresql://u:***@h/db"
    assert source.url_from_argv(["--db", "sqlite:///a"]) == "sqlite:///a"
    assert source.url_from_argv(["--durations=5", "x"]) is None


# --- query layer -------------------------------------------------------------------------


def test_queries_match_sql(db: str) -> None:
    engine = source.make_engine(db)
    latest = queries.latest_runs(engine)
    assert sorted(latest["id"]) == latest_run_ids(db)
    case_id = synth_cases(SPEC.cases)[0].case_id
    s = queries.series(engine, "fa2_cuda", case_id, H200)
    want = sql(db, "SELECT r.median_ms FROM results r JOIN variants v ON v.id = r.variant_id "
                   "JOIN cases c ON c.id = r.case_pk JOIN runs ON runs.id = r.run_id "
                   "WHERE v.name = 'fa2_cuda' AND c.case_id = :c AND runs.gpu_model_key = :g "
                   "ORDER BY runs.created_at", c=case_id, g=H200)
    assert list(s["median_ms"]) == pytest.approx([w[0] for w in want])
    assert s["created_at"].dt.tz is not None  # aware UTC timestamps
    commit = sql(db, 'SELECT "commit" FROM runs WHERE id = 3')[0][0]
    assert queries.resolve_run(engine, "3") == 3
    gpu3 = sql(db, "SELECT gpu_model_key FROM runs WHERE id = 3")[0][0]
    assert queries.resolve_run(engine, commit[:8], gpu3) == 3
    assert queries.resolve_run(engine, "zzzz") is None
    engine.dispose()


def test_rare_lookups_seek_their_index_on_sqlite(db: str, tmp_path: Path) -> None:
    """Flagged verdicts and backward passes are rare, but ANALYZE tells SQLite's planner
    only averages: on a million-result history it sees a verdict value as a sixth of the
    comparisons and the one pass name as every result, and scanned both tables. With
    those statistics the History's lookups still seek the index (the alert list reads the
    few rows of `alerts`, harness.records.alerts)."""
    import sqlite3

    from sqlalchemy import event

    path = tmp_path / "stats.sqlite"
    shutil.copy(make_url(db).database, path)
    raw = sqlite3.connect(path)
    raw.execute("ANALYZE")
    raw.execute("DELETE FROM sqlite_stat1 WHERE tbl IN ('comparisons', 'results')")
    raw.executemany("INSERT INTO sqlite_stat1 VALUES (?, ?, ?)", [
        ("comparisons", "ix_comparisons_verdict", "995000 165834"),
        ("comparisons", "ix_comparisons_run", "995000 1000"),
        ("results", "ix_results_pass_variant", "1000000 1000000 100000"),
        ("results", "ix_results_variant_case", "1000000 100000 1000"),
        ("results", "ix_results_run", "1000000 1000")])
    raw.commit()
    raw.close()
    engine = source.make_engine(f"sqlite:///{path}")
    seen: list[tuple[str, object]] = []
    event.listen(engine, "before_cursor_execute",
                 lambda _c, _cur, stmt, params, _ctx, _many: seen.append((stmt, params)))
    bf16 = next(c.case_id for c in synth_cases(SPEC.cases) if "-bf16-" in c.case_id)
    plans = {}
    for name, call in (("series_flags", lambda: queries.series_flags(engine, "fa2_tc", bf16)),
                       ("recent_flags", lambda: queries.recent_flags(engine)),
                       ("variant_names", lambda: queries.variant_names(engine))):
        seen.clear()
        assert len(call()) > 0
        raw = sqlite3.connect(path)
        plans[name] = " | ".join(r[3] for stmt, params in seen
                                 for r in raw.execute("EXPLAIN QUERY PLAN " + stmt, params))
        raw.close()
    engine.dispose()
    for name in ("series_flags", "recent_flags"):
        assert "USING INDEX ix_comparisons_verdict" in plans[name], plans[name]
        assert "SCAN comparisons" not in plans[name], plans[name]
    assert "ix_results_pass_variant (pass_name<?)" in plans["variant_names"], plans


def test_dashboard_is_read_only(db: str) -> None:
    engine = source.make_engine(db)
    with (pytest.raises(Exception, match="readonly|read-only|query_only|attempt to write"),
          engine.begin() as conn):
        conn.execute(text("DELETE FROM runs"))
    engine.dispose()
    assert sql(db, "SELECT COUNT(*) FROM runs")[0][0] == SPEC.commits * SPEC.gpus


# --- import boundary, CLI, optional Submit page -------------------------------------------

_BOUNDARY = """
import json, os, sys
from streamlit.testing.v1 import AppTest
for page in {pages!r}:
    at = AppTest.from_file({app!r}, default_timeout=60)
    at.query_params["page"] = page
    at.run()
    assert not at.exception, (page, [e.value for e in at.exception])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "cupy", "triton")
               or m in ("harness.core.cases", "harness.candidates.registry", "harness.candidates.cuda_candidate",
                        "harness.candidates.compile", "harness.records.record", "harness.records.db.store"))
print(json.dumps(heavy))
"""


def test_never_imports_torch_cupy_or_kernels(db: str) -> None:
    code = _BOUNDARY.format(pages=PAGES, app=str(APP))
    env = dict(os.environ, FA_HARNESS_DB=db, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_cli_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.cli import build_parser, cmd_dashboard, main

    args = build_parser().parse_args(["dashboard", "--db", "sqlite:///x.sqlite", "--port",
                                      "9000"])
    cmd = cmd_dashboard.command(args)
    assert cmd[1:4] == ["-m", "harness.dashboard.serve", "run"] and cmd[4].endswith("dashboard/app.py")
    assert cmd[cmd.index("--server.port") + 1] == "9000"
    assert cmd[cmd.index("--server.headless") + 1] == "true"
    assert cmd[-3:] == ["--", "--db", "sqlite:///x.sqlite"]
    assert main(["dashboard", "--port", "70000"]) == 2


def _copy_app(tmp_path: Path, submit: str | None) -> Path:
    d = tmp_path / "dashboard"
    d.mkdir()
    shutil.copy(APP, d / "app.py")
    if submit is not None:
        (d / "page_submit.py").write_text(submit)
    return d / "app.py"


@pytest.mark.parametrize("variant", ["absent", "script", "render", "broken"])
def test_submit_page_is_optional(variant: str, db: str, tmp_path: Path, monkeypatch) -> None:
    # The copied app.py finds the already-imported dashboard package for everything except
    # page_submit.py, which it looks for next to itself.
    submit = {
        "absent": None,
        "script": "import streamlit as st\nst.title('Submit a kernel')\n",
        "render": "import streamlit as st\n\ndef render(db_url):\n    st.title('Submit')\n"
                  "    st.caption(db_url)\n",
        "broken": "raise RuntimeError('half-written page')\n",
    }[variant]
    monkeypatch.setenv("FA_HARNESS_DB", db)
    at = AppTest.from_file(str(_copy_app(tmp_path, submit)), default_timeout=60)
    at.query_params["page"] = "submit"
    at.run()
    assert not at.exception
    if variant == "absent":
        assert "page=submit" in texts(at.warning)
    elif variant == "script":
        assert at.title[0].value == "Submit a kernel"
    elif variant == "render":
        assert at.title[0].value == "Submit" and db in texts(at.caption)
    else:
        assert "half-written page" in texts(at.error)


# --- PostgreSQL --------------------------------------------------------------------------


@pytest.fixture
def pg_db() -> str:
    """A scratch database of its own (not a schema: the read-only engine sets its own
    connection options), dropped afterwards."""
    import uuid

    from sqlalchemy.engine import make_url

    admin_url = os.environ.get("FA_HARNESS_TEST_PG")
    if not admin_url:
        pytest.skip("FA_HARNESS_TEST_PG is not set (PostgreSQL URL of a scratch database)")
    name = f"fa_dash_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        engine = create_engine(url)
        generate(engine, SPEC, bulk=True)  # the COPY path of the generator
        engine.dispose()
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.mark.postgres
def test_pages_on_postgresql(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(pg_db, monkeypatch)
    assert {m.label: m.value for m in at.metric}["runs"] == str(SPEC.commits * SPEC.gpus)
    case_id = synth_cases(SPEC.cases)[0].case_id
    at = app(pg_db, monkeypatch, page="history", variant="fa2_tc", case=case_id, gpu=H200)
    assert len(charts(at)) == 1 and len(at.dataframe[-1].value) == SPEC.commits
    run_id = sql(pg_db, "SELECT run_id FROM results WHERE status = 'failed' LIMIT 1")[0][0]
    at = app(pg_db, monkeypatch, page="run", run=str(run_id))
    fails = next(d.value for d in at.dataframe if "message" in d.value.columns)
    assert "base_err" in fails.iloc[0]["message"]
    for page in ("compare", "roofline", "correctness", "leaderboard"):
        app(pg_db, monkeypatch, page=page)


@pytest.mark.parametrize("page", ["overview", "run", "roofline", "correctness", "compare"])
def test_run_without_results(page: str, tmp_path: Path, monkeypatch) -> None:
    """A run whose results never arrived (an interrupted import) is shown, not a crash."""
    from harness.dashboard.schema import Run

    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    engine = create_engine(url)
    generate(engine, SynthSpec(commits=2, gpus=1, variants=2, cases=2))
    with engine.begin() as conn:
        rid = conn.execute(Run.__table__.insert().values(
            uuid="empty-run", commit="ab" * 20, branch="main", gpu_model_key=H200,
            gpu_name=H200, created_at=datetime(2027, 1, 1, tzinfo=UTC), source="cli")
        ).inserted_primary_key[0]
    engine.dispose()
    at = app(url, monkeypatch, page=page, run=str(rid), new=str(rid), gpu=H200)
    assert not at.error or page == "overview"
    if page in ("run", "correctness"):
        assert {m.label: m.value for m in at.metric}.get("passed") == "0"


def test_text_shown_through_markdown_is_escaped():
    """st.table renders its cells as Markdown: a sanitizer's "__global__" turned bold on
    the Leaderboard's messages, and a submitter's text could have been a link."""
    import re

    from harness.dashboard.ui import md_escape

    text = "memcheck: Invalid __global__ write at k.cu:97 [x](http://e) :red[y] $z$ *a*"
    out = md_escape(text)
    assert "\\_\\_global\\_\\_" in out and "\\[x\\]\\(http\\:" in out
    # every Markdown-active character is preceded by a backslash
    assert not re.search(r"(?<!\\)[`*_\[\]()!<>#|~&$:]", out.replace("\\\\", ""))
    assert md_escape(None) == "" and md_escape("a\nb") == "a b"
