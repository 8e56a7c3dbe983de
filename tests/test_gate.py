"""The CI gate flow: record -> store -> baseline -> compare -> summary -> exit code, with
synthetic records (timing regressions) and with the CPU algorithm models (correctness)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from harness.cli import main as cli_main
from harness.core.cases import Case, MaskKind
from harness.records.db.models import Comparison
from harness.records.db.store import counts, open_db
from harness.records.record import RunRecord, spooled
from harness.records.synthetic import make_record, specs_for
from harness.runs import gate, gate_run
from harness.runs.gate import GateOptions, finish


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
    # The same slow build again, now against a window of main that holds the slow run:
    # against the window's mean it is about 5% slower, the bar of a case whose
    # run-to-run spread is unknown (harness.records.noise.NO_HISTORY_CHANGE), so the
    # regression is not reported again; the alert the second run opened stays open and
    # holds this run.
    third = finish(make_record(slow, seed=3, commit="c" * 40, parent="z" * 40, minutes=9),
                   opts, log=_quiet)
    assert third.baseline.startswith("last 2 run(s) on main")
    assert third.exit_code == 0
    [alert] = third.open_alerts
    assert alert.first_run_id == second.run_id and third.run_id in alert.detail["runs"]


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
    monkeypatch.setattr(gate_run, "gpu_state", lambda: (False, "no GPU in this test"))
    db = str(tmp_path / "ci.sqlite")
    args = ["ci", "--grid", "tiny,perf", "--kernels", "fa2_model,naive_model", "--db", db,
            "--summary", str(tmp_path / "s.md"), "--record", str(tmp_path / "run.json")]
    monkeypatch.setenv("FA_HARNESS_COMMIT", "1" * 40)
    monkeypatch.setenv("FA_HARNESS_PARENT", "0" * 40)
    assert cli_main(args) == 0
    rec = RunRecord.read(tmp_path / "run.json")
    assert {e["status"] for e in rec.results} == {"passed"}
    # Both forwards, and the backward of the one that declares one (fa2_model): its own
    # entries, judged on the same cases.
    passes = sorted((e["kernel"], e.get("pass", "fwd")) for e in rec.results)
    assert passes == [("fa2_model", "bwd")] * 2 + [("fa2_model", "fwd")] * 2 + \
        [("naive_model", "fwd")] * 2, passes
    assert all(e["extra"]["grad_errors"]["factor"] == 3.0 for e in rec.results
               if e.get("pass") == "bwd")
    assert rec.gpu is None and rec.commit == "1" * 40 and rec.grids == ["tiny", "perf"]
    assert all(e["errors"]["ratio"] is not None for e in rec.results)
    text = (tmp_path / "s.md").read_text()
    assert "grid perf: timing needs a GPU; not run" in text
    monkeypatch.setenv("FA_HARNESS_COMMIT", "2" * 40)
    monkeypatch.setenv("FA_HARNESS_PARENT", "1" * 40)
    assert cli_main(args) == 0
    assert "parent commit 111111111111" in capsys.readouterr().out
    with open_db(db) as d:
        assert counts(d)["comparisons"] == 6


def test_cli_ci_usage_errors_write_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FA_HARNESS_HOME", str(tmp_path))
    monkeypatch.setattr(gate_run, "gpu_state", lambda: (False, "no GPU in this test"))
    assert cli_main(["ci", "--grid", "nope", "--db", str(tmp_path / "x.sqlite")]) == 2
    assert "unknown grid 'nope'" in capsys.readouterr().err
    assert cli_main(["ci", "--grid", "smoke", "--kernels", "no_such_kernel"]) == 2
    assert "unknown kernel(s) no_such_kernel" in capsys.readouterr().err
    assert not (tmp_path / "x.sqlite").exists() and not (tmp_path / "spool").exists()


@pytest.mark.gpu
@pytest.mark.exclusive
def test_gate_times_on_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    # named, so owned: its floor is timed first, the rest of its perf cases are listed
    opts = _opts(tmp_path, grids=["perf"], kernels=["sdpa_flash"], budget_min=1.0,
                 timing_min=4, timing_cases=6)
    ex = gate.execute(opts, log=_quiet)
    assert ex.meta["gpu"] and ex.meta["gpu"]["model_key"] != "cpu"
    timed = [r for r in ex.results if r.status == "passed"]
    assert len(timed) >= 4 and all(r.timing and len(r.timing.samples_ms) >= 10 for r in timed)
    assert ex.plan.left_out and ex.not_measured == [] and ex.owned == ["sdpa_flash"]
    out = finish(RunRecord.from_results(ex.results, ex.meta), opts, log=_quiet,
                 plan=ex.plan)
    assert out.run_id is not None
    assert out.record.env["ci_plan"]["left_out"]


def test_a_peer_divergence_is_named_and_recorded_not_a_failure(tmp_path):
    specs = specs_for(kernels=("fa2", "sdpa_cudnn"))
    for s in specs[3:]:
        s.status = "failed"
    rec = make_record(specs, seed=1)
    rec.kernels["sdpa_cudnn"]["kind"] = "peer"
    out = finish(rec, _opts(tmp_path), log=_quiet)
    assert out.exit_code == 0 and out.failures == []
    [line] = out.peer_divergences
    assert line.startswith("peer divergence: sdpa_cudnn returns mean(V) on fully masked rows "
                           "(and a non-zero dQ there in the backward), 3 case(s)")
    assert "fa-harness CI: passed" in out.summary and line in out.summary
    # the same failure of a team candidate is red
    rec2 = make_record(specs, seed=2, minutes=1)
    assert finish(rec2, _opts(tmp_path), log=_quiet).exit_code == 1


def test_a_load_error_fails_the_gate_and_is_named(tmp_path):
    out = finish(make_record(specs_for(), seed=1), _opts(tmp_path), log=_quiet,
                 load_errors=["kernels/broken/manifest.toml: name: must be letters"])
    assert out.exit_code == 1
    assert "1 candidate(s) failed to load" in out.summary
    assert "kernels/broken/manifest.toml" in out.summary


def test_a_kernel_missing_from_the_baseline_fails_unless_left_out_on_purpose(tmp_path):
    from harness.runs.plan import LeftOut, Plan

    opts = _opts(tmp_path)
    first = finish(make_record(specs_for(), seed=1, commit="a" * 40), opts, log=_quiet)
    assert first.exit_code == 0
    gone = make_record(specs_for(kernels=("fa2",)), seed=2, commit="b" * 40, parent="a" * 40,
                       minutes=1)
    out = finish(gone, opts, log=_quiet)
    assert out.exit_code == 1 and "missing 3" in out.summary
    # the plan chose not to time naive: the same run is green, and says why
    plan = Plan(budget_s=300, min_time_s=0.2,
                left_out=[LeftOut("naive", "timing = smoke",
                                  [e["case_id"] for e in first.record.results
                                   if e["kernel"] == "naive"])])
    again = make_record(specs_for(kernels=("fa2",)), seed=3, commit="b" * 40,
                        parent="a" * 40, minutes=2)
    ok = finish(again, opts, log=_quiet, plan=plan)
    assert ok.exit_code == 0, ok.summary
    assert "3 baseline entries not in this run: left out by the plan" in ok.summary
    # --kernels fa2: naive was not asked for
    opts.kernels = ["fa2"]
    again = make_record(specs_for(kernels=("fa2",)), seed=4, commit="b" * 40,
                        parent="a" * 40, minutes=3)
    assert finish(again, opts, log=_quiet).exit_code == 0


def test_cli_compare_exits_1_when_the_new_run_misses_kernels(tmp_path, capsys):
    base = make_record(specs_for(), seed=1).write(tmp_path / "base.json")
    new = make_record(specs_for(kernels=("fa2",)), seed=2, minutes=1).write(tmp_path / "n.json")
    assert cli_main(["compare", str(base), str(new)]) == 1
    assert "missing 3" in capsys.readouterr().out


def test_cli_ci_prints_lines_as_it_goes_and_records_the_plan(tmp_path, monkeypatch, capsys):
    from harness.core import grids

    monkeypatch.setitem(grids.GRIDS, "tiny", lambda: list(TINY))
    monkeypatch.setenv("FA_HARNESS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setattr(gate_run, "gpu_state", lambda: (False, "no GPU in this test"))
    args = ["ci", "--grid", "tiny", "--kernels", "fa2_model,naive_model", "--db",
            str(tmp_path / "ci.sqlite"), "--record", str(tmp_path / "run.json"),
            "--budget", "2"]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "plan: budget 2 min" in out
    assert "ok   fa2_model: passed 2" in out and "ok   naive_model: passed 2" in out
    rec = RunRecord.read(tmp_path / "run.json")
    assert rec.env["ci_plan"]["budget_s"] == 120
    assert cli_main(args[:-2] + ["--budget", "0"]) == 2
    assert "--budget must be > 0" in capsys.readouterr().err


def test_explicit_baseline_run_compares_two_runs_of_the_same_commit(tmp_path):
    opts = _opts(tmp_path)
    first = finish(make_record(specs_for(), seed=1, commit="a" * 40), opts, log=_quiet)
    slow = specs_for()
    slow[1].median_ms *= 1.10
    # same commit: the parent rule finds nothing, --baseline names the first run
    opts.baseline_run = first.record.uuid
    gate.check_baseline_run(opts)
    out = finish(make_record(slow, seed=2, commit="a" * 40, minutes=1), opts, log=_quiet)
    assert out.baseline.startswith(f"run {first.run_id} (--baseline")
    assert out.exit_code == 1 and [v.variant for v in out.report.failing] == [slow[1].kernel]
    opts.baseline_run = "no-such-run"
    with pytest.raises(gate.GateUsageError, match="no-such-run"):
        gate.check_baseline_run(opts)


def test_cli_ci_fails_on_a_variant_that_does_not_load(tmp_path, monkeypatch, capsys):
    """`run` exited 1 on a load error while `ci` passed: now both fail, naming it."""
    from harness.candidates import registry
    from harness.candidates.variant_spec import LoadError
    from harness.core import grids

    err = LoadError("kernels/broken/manifest.toml", "launch[0].grid[1]", "unknown name 'x'",
                    "broken")
    monkeypatch.setattr(registry, "load_errors", lambda: [err])
    monkeypatch.setitem(grids.GRIDS, "tiny", lambda: list(TINY))
    monkeypatch.setattr(gate_run, "gpu_state", lambda: (False, "no GPU in this test"))
    db = str(tmp_path / "ci.sqlite")
    assert cli_main(["ci", "--grid", "tiny", "--kernels", "fa2_model", "--db", db]) == 0
    capsys.readouterr()
    # without --kernels every load error counts; with --kernels naming it, too
    assert cli_main(["ci", "--grid", "tiny", "--kernels", "fa2_model,broken", "--db", db]) == 1
    out = capsys.readouterr().out
    assert "FAIL load error: kernels/broken/manifest.toml" in out
    assert "1 candidate(s) failed to load" in out
    assert cli_main(["ci", "--grid", "tiny", "--kernels", "broken", "--db", db]) == 1
