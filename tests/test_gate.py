"""The CI gate flow: record -> store -> baseline -> compare -> summary -> exit code, with
synthetic records (timing regressions) and with the CPU algorithm models (correctness)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from harness.cli import main as cli_main
from harness.core.cases import Case, MaskKind
from harness.records import gate
from harness.records.db.models import Comparison
from harness.records.db.store import counts, open_db
from harness.records.gate import GateOptions, finish
from harness.records.record import RunRecord, spooled
from harness.records.synthetic import make_record, specs_for


def _opts(tmp_path: Path, **kw) -> GateOptions:
    return GateOptions(db_url=str(tmp_path / "db.sqlite"), spool_dir=tmp_path / "spool",
                       summary=tmp_path / "summary.md", **kw)


def _quiet(_line: str) -> None:
    pass


def test_gate_passes_then_catches_a_regression_on_the_child_commit(tmp_path):
    opts = _opts(tmp_path)
    first = finish(make_record(specs_for(), seed=1, commit="a" * 40), opts, log=_quiet)
    assert first.exit_code == 0 and first.run_id == 1 and first.baseline == "none"
    assert first.report is None and first.spooled is None and not spooled(opts.spool_dir)
    slow = specs_for()
    slow[2].median_ms *= 1.10
    second = finish(make_record(slow, seed=2, commit="b" * 40, parent="a" * 40, minutes=5),
                    opts, log=_quiet)
    assert second.baseline.startswith("parent commit aaaaaaaaaaaa")
    assert second.exit_code == 1 and second.report.regressed
    [bad] = second.report.failing
    assert bad.verdict == "regression" and bad.variant == slow[2].kernel
    summary = (tmp_path / "summary.md").read_text()
    assert "fa-harness CI: FAILED" in summary and "| regression |" in summary
    with open_db(opts.db_url) as db:
        with db.session() as s:
            rows = s.execute(select(Comparison).where(Comparison.run_id == second.run_id)
                             ).scalars().all()
        assert len(rows) == 6 and sum(r.verdict == "regression" for r in rows) == 1
        assert all(r.base_run_id == first.run_id for r in rows)
    # The same slow build again, now against a window of main: same verdict.
    third = finish(make_record(slow, seed=3, commit="c" * 40, parent="z" * 40, minutes=9),
                   opts, log=_quiet)
    assert third.baseline.startswith("last 2 run(s) on main")
    assert third.exit_code == 1


def test_failing_result_fails_the_gate_without_baseline(tmp_path):
    specs = specs_for()
    specs[0].status = "failed"
    out = finish(make_record(specs, seed=1), _opts(tmp_path), log=_quiet)
    assert out.exit_code == 1 and len(out.failures) == 1
    assert "Failing results (1)" in out.summary


def test_unreachable_database_spools_and_a_later_run_loads_it(tmp_path, monkeypatch):
    opts = _opts(tmp_path)
    # The database's directory cannot be created while a file stands in its place.
    (tmp_path / "dbdir").write_text("not a directory")
    opts.db_url = str(tmp_path / "dbdir" / "db.sqlite")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "gh.md"))
    opts.summary = None
    rec = make_record(specs_for(), seed=1, commit="a" * 40)
    out = finish(rec, opts, log=_quiet)
    assert out.run_id is None and out.db_error and out.exit_code == 0
    assert "database unavailable" in (tmp_path / "gh.md").read_text()
    [kept] = spooled(opts.spool_dir)
    assert RunRecord.read(kept).to_dict() == rec.to_dict()
    # Next run, database back: the spooled record is stored first and becomes the baseline.
    (tmp_path / "dbdir").unlink()
    nxt = finish(make_record(specs_for(), seed=2, commit="b" * 40, parent="a" * 40,
                             minutes=5), opts, log=_quiet)
    assert nxt.baseline.startswith("parent commit") and nxt.exit_code == 0
    assert not spooled(opts.spool_dir) and not list(opts.spool_dir.glob("*.target"))
    with open_db(opts.db_url) as db:
        assert counts(db)["runs"] == 2


def test_spooled_record_waits_for_its_own_database(tmp_path):
    """A record spooled for one database is not stored into another one."""
    opts = _opts(tmp_path)
    opts.db_url = "postgresql+psycopg://postgres:secret@127.0.0.1:1/none"
    finish(make_record(specs_for(), seed=1, commit="a" * 40), opts, log=_quiet)
    [kept] = spooled(opts.spool_dir)
    assert "secret" not in kept.with_suffix(".target").read_text()
    other = _opts(tmp_path)  # the default: another database, same spool
    out = finish(make_record(specs_for(), seed=2, commit="b" * 40), other, log=_quiet)
    assert out.run_id is not None and spooled(opts.spool_dir) == [kept]
    assert any("waiting for its database postgresql+psycopg://postgres:***@127.0.0.1:1"
               in n for n in out.notes)


def test_cli_import_without_arguments_loads_the_spool(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FA_HARNESS_HOME", str(tmp_path))
    monkeypatch.delenv("FA_HARNESS_DB", raising=False)
    monkeypatch.delenv("FA_HARNESS_SPOOL", raising=False)
    from harness.records.record import spool

    spool(make_record(specs_for(), seed=1))
    spool(make_record(specs_for(), seed=2, minutes=1))
    assert cli_main(["import"]) == 0
    assert "imported 2 spooled record(s)" in capsys.readouterr().out
    assert not list((tmp_path / "spool").glob("*.json"))


TINY = [Case(1, 2, 2, 17, 33, 16, "float16", MaskKind.CAUSAL_BR),
        Case(2, 2, 1, 9, 9, 32, "bfloat16", MaskKind.KEY_PADDING)]


def test_cli_ci_runs_cpu_models_and_compares_with_the_parent(tmp_path, monkeypatch, capsys):
    from harness.core import grids

    monkeypatch.setitem(grids.GRIDS, "tiny", lambda: list(TINY))
    monkeypatch.setenv("FA_HARNESS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setenv("FA_HARNESS_BRANCH", "main")
    monkeypatch.setattr(gate, "gpu_present", lambda: False)
    db = str(tmp_path / "ci.sqlite")
    args = ["ci", "--grid", "tiny,perf", "--kernels", "fa2_model,naive_model", "--db", db,
            "--summary", str(tmp_path / "s.md"), "--record", str(tmp_path / "run.json")]
    monkeypatch.setenv("FA_HARNESS_COMMIT", "1" * 40)
    monkeypatch.setenv("FA_HARNESS_PARENT", "0" * 40)
    assert cli_main(args) == 0
    rec = RunRecord.read(tmp_path / "run.json")
    assert len(rec.results) == 4 and {e["status"] for e in rec.results} == {"passed"}
    assert rec.gpu is None and rec.commit == "1" * 40 and rec.grids == ["tiny", "perf"]
    assert all(e["errors"]["ratio"] is not None for e in rec.results)
    text = (tmp_path / "s.md").read_text()
    assert "grid perf: timing needs a GPU; not run" in text
    monkeypatch.setenv("FA_HARNESS_COMMIT", "2" * 40)
    monkeypatch.setenv("FA_HARNESS_PARENT", "1" * 40)
    assert cli_main(args) == 0
    assert "parent commit 111111111111" in capsys.readouterr().out
    with open_db(db) as d:
        assert counts(d)["comparisons"] == 4


def test_cli_ci_usage_errors_write_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FA_HARNESS_HOME", str(tmp_path))
    monkeypatch.setattr(gate, "gpu_present", lambda: False)
    assert cli_main(["ci", "--grid", "nope", "--db", str(tmp_path / "x.sqlite")]) == 2
    assert "unknown grid 'nope'" in capsys.readouterr().err
    assert cli_main(["ci", "--grid", "smoke", "--kernels", "no_such_kernel"]) == 2
    assert "unknown kernel(s) no_such_kernel" in capsys.readouterr().err
    assert not (tmp_path / "x.sqlite").exists() and not (tmp_path / "spool").exists()


@pytest.mark.gpu
def test_gate_times_on_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    opts = _opts(tmp_path, grids=["perf"], kernels=["sdpa_flash"])
    results, meta, _ = gate.execute(opts, log=_quiet)
    assert meta["gpu"] and meta["gpu"]["model_key"] != "cpu"
    timed = [r for r in results if r.status == "passed"]
    assert timed and all(r.timing and len(r.timing.samples_ms) >= 10 for r in timed)
    out = finish(RunRecord.from_results(results, meta), opts, log=_quiet)
    assert out.run_id is not None
