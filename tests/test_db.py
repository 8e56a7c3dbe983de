"""The results database on SQLite and PostgreSQL: migrations match the models, records
store idempotently and export losslessly, baselines and history queries, read-only
sessions, and `fa-harness db upgrade`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import select, text

from harness.cli import main as cli_main
from harness.records.db import migrate
from harness.records.db.engine import make_engine, read_session, resolve_url
from harness.records.db.models import Base, CaseRow, Comparison, Result, Run, Variant
from harness.records.db.store import (
    DatabaseError,
    DatabaseUnavailable,
    RecordConflict,
    baseline_runs,
    counts,
    get_run,
    history,
    load_record,
    open_db,
    store_comparisons,
    store_record,
)
from harness.records.synthetic import make_record, specs_for


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """An empty database: a SQLite file, or a fresh PostgreSQL schema (dropped after)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.sqlite'}"
    return request.getfixturevalue("pg_url")


def test_migrations_create_exactly_the_models(db_url):
    db = open_db(db_url)
    with db.engine.connect() as conn:
        assert migrate.current_revision(conn) == migrate.head_revision()
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}),
                                Base.metadata)
    db.close()
    assert diff == []


def test_store_is_idempotent_and_export_is_lossless(db_url):
    rec = make_record(specs_for())
    with open_db(db_url) as db:
        run_id = store_record(db, rec)
        assert store_record(db, rec) == run_id
        assert counts(db) == {"runs": 1, "variants": 2, "cases": 3, "results": 6,
                              "comparisons": 0}
        back = load_record(db, run_id)
        assert back.to_dict() == rec.to_dict()
        assert get_run(db, "latest").uuid == rec.uuid == get_run(db, rec.uuid).uuid
        # Same uuid, other content: refused, nothing changed.
        changed = rec.with_results(rec.results[:-1])
        with pytest.raises(RecordConflict, match=rec.uuid):
            store_record(db, changed)
        assert counts(db)["results"] == 6
        # A second run shares variants and cases.
        store_record(db, make_record(specs_for(), seed=5, minutes=3))
        assert counts(db) == {"runs": 2, "variants": 2, "cases": 3, "results": 12,
                              "comparisons": 0}
        with db.session() as s:
            run = s.execute(select(Run).where(Run.id == run_id)).scalar_one()
            assert run.created_at.tzinfo is not None and run.gpu_model_key == "nvidia-h200"
            assert run.cuda == "13.0" and run.env["synthetic"] is True
            row = s.execute(select(Result).where(Result.run_id == run_id)).scalars().first()
            assert isinstance(row.samples_ms, list) and row.registers == 128
            assert s.execute(select(Variant.source_hash).where(Variant.name == "fa2")
                             ).scalar_one() == "hash-fa2"
            assert s.execute(select(CaseRow.mask).where(CaseRow.case_id ==
                             rec.results[1]["case_id"])).scalar_one() == "causal_br"


def test_baseline_parent_commit_then_branch_window(db_url):
    specs = specs_for()
    with open_db(db_url) as db:
        ids = [store_record(db, make_record(specs, seed=i, commit=f"{i:040d}", minutes=i,
                                           branch="main"))
               for i in range(7)]
        other_gpu = store_record(db, make_record(specs, seed=50, commit="9" * 40, minutes=8,
                                                 gpu={"name": "NVIDIA H100"}))
        pr = store_record(db, make_record(specs, seed=60, commit="f" * 40, parent=f"{5:040d}",
                                          branch="feature", minutes=20))
        how, runs = baseline_runs(db, get_run(db, pr))
        assert how.startswith("parent commit") and [r.id for r in runs] == [ids[5]]
        orphan = store_record(db, make_record(specs, seed=61, commit="e" * 40,
                                              parent="d" * 40, branch="feature", minutes=21))
        how, runs = baseline_runs(db, get_run(db, orphan), window=3)
        assert [r.id for r in runs] == [ids[6], ids[5], ids[4]]  # newest first, same GPU
        assert other_gpu not in [r.id for r in runs]
        hist = history(db, "fa2", specs[0].case.id, gpu_model_key="nvidia-h200")
        assert len(hist) == 9 and hist[0]["created_at"] >= hist[-1]["created_at"]
        n = store_comparisons(db, pr, ids[5], [])
        assert n == 0


def test_comparisons_are_stored_and_replaced(db_url):
    from harness.records.compare import compare_records

    base = make_record(specs_for(), seed=1)
    new = make_record(specs_for(), seed=2, minutes=5)
    report = compare_records(base, new)
    with open_db(db_url) as db:
        b, n = store_record(db, base), store_record(db, new)
        assert store_comparisons(db, n, b, report.verdicts) == 6
        assert store_comparisons(db, n, b, report.verdicts) == 6
        with db.session() as s:
            rows = s.execute(select(Comparison).where(Comparison.run_id == n)).scalars().all()
        assert len(rows) == 6 and {r.verdict for r in rows} == {"same"}
        assert all(r.detail["n_base"] == 20 for r in rows)


def test_read_session_refuses_writes(db_url):
    with open_db(db_url) as db:
        store_record(db, make_record(specs_for()))
    with read_session(db_url) as s:
        assert s.execute(select(Run)).scalars().one().source == "ci"
        with pytest.raises(Exception, match="(?i)read.only|readonly|attempt to write"):
            s.execute(text("DELETE FROM results"))
            s.flush()
            s.commit()


@pytest.mark.postgres
def test_readonly_engine_keeps_the_url_options(pg_url):
    """A read-only engine adds its own server option to those of the URL (a search_path
    naming the schema), it does not replace them."""
    rw = make_engine(pg_url)
    with rw.begin() as c:
        schema = c.exec_driver_sql("SHOW search_path").scalar()
        c.execute(text("CREATE TABLE marker (x integer)"))
        c.execute(text("INSERT INTO marker VALUES (7)"))
    rw.dispose()
    assert schema.startswith("fa_test_")
    # Two `options` parameters arrive as a tuple; both must survive as well.
    two = f"{pg_url}&options=-cstatement_timeout%3D12345"
    for u, timeout in ((pg_url, None), (two, "12345ms")):
        ro = make_engine(u, readonly=True)
        try:
            with ro.connect() as c:
                assert c.exec_driver_sql("SHOW search_path").scalar() == schema
                assert c.exec_driver_sql("SHOW default_transaction_read_only").scalar() == "on"
                if timeout:
                    assert c.exec_driver_sql("SHOW statement_timeout").scalar() == timeout
                assert c.execute(text("SELECT x FROM marker")).scalar() == 7
            with pytest.raises(Exception, match="read-only transaction"), ro.begin() as c:
                c.execute(text("INSERT INTO marker VALUES (8)"))
        finally:
            ro.dispose()


def test_open_db_errors_are_clear(tmp_path, monkeypatch):
    with pytest.raises(DatabaseError, match="no database at"):
        open_db(str(tmp_path / "absent.sqlite"), create=False)
    with pytest.raises(DatabaseUnavailable, match="cannot connect"):
        open_db("postgresql+psycopg://postgres@127.0.0.1:1/none")
    with pytest.raises(DatabaseError, match="bad database URL"):
        open_db("nosuchdialect://x/y")
    monkeypatch.setenv("FA_HARNESS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FA_HARNESS_DB", raising=False)
    assert resolve_url(None) == f"sqlite:///{tmp_path / 'home' / 'results.sqlite'}"
    with open_db() as db:  # the default file, created with its directory
        assert db.engine.dialect.name == "sqlite"
    assert (tmp_path / "home" / "results.sqlite").exists()


def test_sqlite_pragmas(tmp_path):
    with open_db(str(tmp_path / "r.sqlite")) as db, db.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 10_000


def test_schema_upgrade_only_when_allowed(db_url):
    engine = make_engine(db_url)
    with engine.begin() as c:  # a database some other tool already uses
        c.execute(text("CREATE TABLE unrelated (x integer)"))
    engine.dispose()
    with pytest.raises(DatabaseError, match="fa-harness db upgrade"):
        open_db(db_url, upgrade=False)
    with pytest.raises(DatabaseError, match="fa-harness db upgrade"):
        open_db(db_url, readonly=True)
    assert cli_main(["db", "upgrade", "--db", db_url]) == 0
    with open_db(db_url, upgrade=False) as db:
        assert counts(db)["runs"] == 0
    engine = make_engine(db_url)
    migrate.downgrade(engine, "base")  # the downgrade path works too
    with engine.connect() as c:
        assert migrate.current_revision(c) is None
    engine.dispose()


def test_cli_db_upgrade_and_current(tmp_path, capsys):
    url = str(tmp_path / "sub" / "x.sqlite")
    assert cli_main(["db", "upgrade", "--db", url]) == 0
    head = migrate.head_revision()
    assert f"empty -> {head}" in capsys.readouterr().out
    assert cli_main(["db", "upgrade", "--db", url]) == 0
    assert f"already at {head}" in capsys.readouterr().out
    assert cli_main(["db", "current", "--db", url]) == 0
    assert "runs: 0" in capsys.readouterr().out
    assert cli_main(["db", "upgrade", "--db", "postgresql+psycopg://postgres@127.0.0.1:1/x"]) == 2


def test_cli_export_round_trip(tmp_path, capsys):
    url = str(tmp_path / "r.sqlite")
    rec = make_record(specs_for())
    src = rec.write(tmp_path / "in.json")
    assert cli_main(["import", str(src), "--db", url]) == 0
    assert cli_main(["export", "--run", "latest", "-o", str(tmp_path / "out.json"),
                     "--db", url]) == 0
    assert (tmp_path / "out.json").read_text() == src.read_text()
    assert cli_main(["export", "--run", "42", "-o", str(tmp_path / "x.json"), "--db", url]) == 2
    assert "no run '42'" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_baseline_prefers_runs_of_the_same_grids(db_url):
    specs = specs_for()
    with open_db(db_url) as db:
        smoke = make_record(specs, seed=1, commit="a" * 40, minutes=1)
        smoke.grids = ["smoke"]
        perf = make_record(specs, seed=2, commit="a" * 40, minutes=2)
        perf.grids = ["perf"]
        s_id, _p_id = store_record(db, smoke), store_record(db, perf)
        new = make_record(specs, seed=3, commit="b" * 40, parent="a" * 40, minutes=3)
        new.grids = ["smoke"]
        how, runs = baseline_runs(db, get_run(db, store_record(db, new)))
        assert [r.id for r in runs] == [s_id]


def test_schema_modules_import_without_torch():
    """`harness.records.db.models` / `.engine` pull SQLAlchemy only; the package's public names
    still resolve (the store on first use, without torch)."""
    code = (
        "import sys, json\n"
        "import harness.records.db.engine, harness.records.db.models, harness.records.db\n"
        "before = sorted(m for m in sys.modules if m.split('.')[0] == 'torch'"
        " or m == 'harness.records.db.store')\n"
        "from harness.records.db import DatabaseError, open_db, make_engine, read_session\n"
        "from harness.records.db.store import open_db as store_open_db\n"
        "assert open_db is store_open_db and issubclass(DatabaseError, Exception)\n"
        "assert make_engine is harness.records.db.engine.make_engine\n"
        "assert 'open_db' in dir(harness.records.db)\n"
        "try:\n"
        "    harness.records.db.no_such_name\n"
        "except AttributeError as e:\n"
        "    assert 'no_such_name' in str(e)\n"
        "else:\n"
        "    raise SystemExit('missing name resolved')\n"
        "print(json.dumps([before, 'torch' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, torch_after = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == []
    # the store loaded when its names were asked for, and still no torch: the case layer
    # imports it on first use only, so database commands start without it
    assert not torch_after
