"""Run records: building from results, validation with named fields, atomic writes, the
spool, git metadata, and pytest-benchmark import."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from harness.cli import main as cli_main
from harness.core.cases import Case, MaskKind
from harness.core.results import CaseResult, Errors, Status, Timing
from harness.records.benchimport import record_from_benchmark_json
from harness.records.record import (
    SCHEMA_VERSION,
    RecordError,
    RunRecord,
    git_metadata,
    spool,
    spooled,
    validate,
)
from harness.records.synthetic import make_record, specs_for

CASE = Case(2, 4, 2, 113, 203, 64, "float16", MaskKind.CAUSAL_BR, seed=3)


def _result(kernel: str = "fa2", status: Status = Status.PASSED) -> CaseResult:
    return CaseResult(kernel, CASE, status, message="ok" if status == Status.PASSED else "bad",
                      errors=Errors(out_err=1e-3, base_err=2e-3, floor=1e-5, ratio=0.5,
                                    lse_err=float("nan"), worst_index=[0, 1, 2, 3]),
                      timing=Timing(samples_ms=[1.0, 1.1, 0.9], median_ms=1.0, min_ms=0.9,
                                    iqr_ms=0.1, rel_noise=0.05, mode="cold", method="events"),
                      flops=123456789012, tflops=0.12, bytes_model=10, bytes_ideal=5,
                      extra={"registers": 96, "note": "x"})


META = {"commit": "a" * 40, "parent": "b" * 40, "branch": "main", "source": "cli",
        "gpu": {"name": "NVIDIA H200", "uuid": "GPU-1"}, "grids": ["smoke"],
        "kernels": {"fa2": {"kind": "cuda", "source_hash": "abc", "spills": 0}}}


def test_from_results_round_trips_case_results(tmp_path):
    rec = RunRecord.from_results([_result(), _result("naive", Status.FAILED)], META)
    assert rec.schema_version == SCHEMA_VERSION
    assert rec.gpu_model_key == "nvidia-h200"
    e = rec.results[0]
    assert e["kernel"] == "fa2" and e["case_id"] == CASE.id and e["samples_ms"] == [1.0, 1.1, 0.9]
    assert e["registers"] == 96 and e["spills"] == 0  # per result, else per kernel
    assert e["errors"]["lse_err"] == "nan"  # JSON has no NaN: kept, not dropped
    path = rec.write(tmp_path / "r.json")
    text = path.read_text()
    assert text.startswith("{\n \"")  # indent=1, sorted keys: diffable
    assert json.loads(text)["results"][1]["status"] == "failed"
    back = RunRecord.read(path)
    assert back.to_dict() == rec.to_dict()
    assert back.sha256() == rec.sha256()
    r0 = back.case_results()[0]
    assert r0.case == CASE and r0.status is Status.PASSED
    assert r0.timing.samples_ms == [1.0, 1.1, 0.9]
    assert math.isnan(r0.errors.lse_err) and r0.errors.worst_index == [0, 1, 2, 3]
    assert r0.extra["note"] == "x" and r0.flops == 123456789012
    assert r0.timing.sm_clock_mhz is None and "sm_clock_mhz" not in e["extra"]


def test_the_median_sm_clock_travels_in_extra_and_back(tmp_path):
    r = _result()
    r.timing.sm_clock_mhz = 1965.5
    rec = RunRecord.from_results([r], META)
    assert rec.results[0]["extra"]["sm_clock_mhz"] == 1965.5
    back = RunRecord.read(rec.write(tmp_path / "r.json")).case_results()[0]
    assert back.timing.sm_clock_mhz == 1965.5 and "sm_clock_mhz" not in back.extra
    assert RunRecord.from_results([back], META).to_dict()["results"] == rec.to_dict()["results"]


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("commit"), "commit: missing"),
    (lambda d: d.pop("gpu"), "gpu: missing"),
    (lambda d: d["results"][0].pop("median_ms"), "results[0].median_ms: missing"),
    (lambda d: d["results"][1].pop("kernel"), "results[1].kernel: missing"),
    (lambda d: d["results"][0].__setitem__("status", "great"), "results[0].status"),
    (lambda d: d["results"][0].__setitem__("samples_ms", [1, "x"]), "results[0].samples_ms"),
    (lambda d: d["results"][0]["case"].pop("head_dim"), "results[0].case"),
    (lambda d: d.__setitem__("uuid", "nope"), "uuid"),
    (lambda d: d.__setitem__("created_at", "yesterday"), "created_at"),
    (lambda d: d["results"].append(dict(d["results"][0])), "duplicate"),
])
def test_validation_names_the_field(mutate, field):
    d = make_record(specs_for()).to_dict()
    assert validate(d) == []
    mutate(d)
    problems = validate(d)
    assert problems and any(field in p for p in problems), problems
    with pytest.raises(RecordError, match="."):
        RunRecord.from_dict(d)


def test_unknown_schema_version_is_refused():
    d = make_record(specs_for()).to_dict()
    d["schema_version"] = 99
    assert validate(d) == ["schema_version: unknown version 99 (this fa-harness reads 1)"]
    del d["schema_version"]
    assert "schema_version: missing" in validate(d)[0]


def test_invalid_record_writes_nothing(tmp_path):
    rec = make_record(specs_for())
    rec.results[0]["status"] = "bogus"
    target = tmp_path / "out" / "r.json"
    with pytest.raises(RecordError, match=r"results\[0\]\.status"):
        rec.write(target)
    assert not target.exists()
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_record_read_back_is_validated_once_and_again_after_any_change(monkeypatch):
    import harness.records.record as record_mod

    text = make_record(specs_for()).dumps()
    calls = []
    real = record_mod.validate
    monkeypatch.setattr(record_mod, "validate", lambda d: calls.append(1) or real(d))
    rec = RunRecord.from_dict(json.loads(text))
    rec.check()  # unchanged since from_dict validated it: no second walk of the schema
    assert len(calls) == 1
    rec.results[0]["status"] = "bogus"
    with pytest.raises(RecordError, match=r"results\[0\]\.status"):
        rec.check()
    rec.results[0]["status"] = "passed"
    rec.results[0]["median_ms"] = float("inf")
    with pytest.raises(RecordError, match=r"results\[0\]\.median_ms"):
        rec.check()
    assert len(calls) == 3


def test_read_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(RecordError, match="not JSON"):
        RunRecord.read(bad)
    with pytest.raises(RecordError, match="no such file"):
        RunRecord.read(tmp_path / "missing.json")


def test_spool_keeps_record_by_uuid(tmp_path):
    rec = make_record(specs_for())
    p = spool(rec, tmp_path / "spool")
    assert p.name == f"{rec.uuid}.json"
    assert spooled(tmp_path / "spool") == [p]
    assert RunRecord.read(p).to_dict() == rec.to_dict()


def test_git_metadata_from_env_and_from_repo(tmp_path, monkeypatch):
    for var in ("FA_HARNESS_COMMIT", "FA_HARNESS_BRANCH", "FA_HARNESS_PARENT", "GITHUB_SHA",
                "CI_COMMIT_SHA", "GITHUB_HEAD_REF", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME",
                "CI_MERGE_REQUEST_SOURCE_BRANCH_NAME"):
        monkeypatch.delenv(var, raising=False)
    # Not a repository: tolerated, everything None.
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert git_metadata(plain)["commit"] is None
    # A repository with two commits.
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*a: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a],
                              cwd=repo, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q", "-b", "feature")
    (repo / "f").write_text("1")
    git("add", "f")
    git("commit", "-qm", "one")
    first = git("rev-parse", "HEAD")
    (repo / "f").write_text("2")
    git("commit", "-qam", "two")
    meta = git_metadata(repo)
    assert meta["commit"] == git("rev-parse", "HEAD")
    assert meta["parent"] == first and meta["branch"] == "feature" and meta["dirty"] is False
    # CI variables win over the working tree.
    monkeypatch.setenv("GITHUB_SHA", first)
    monkeypatch.setenv("GITHUB_REF_NAME", "main")
    meta = git_metadata(repo)
    assert meta["commit"] == first and meta["branch"] == "main" and meta["parent"] is None


def _bench_json() -> dict:
    return {
        "machine_info": {"node": "n1", "python_version": "3.12",
                         "fa_harness_gpu": {"name": "NVIDIA H200"}},
        "commit_info": {"id": "c" * 40, "branch": "main", "dirty": False},
        "datetime": "2026-12-01T10:00:00.000000+00:00", "version": "5.1.0",
        "benchmarks": [
            {"name": "test_fa2[x]", "fullname": "suites/test_perf.py::test_fa2[x]",
             "params": {"case": CASE.id}, "extra_info": {"kernel": "fa2", "flops": 2e9},
             "stats": {"min": 0.001, "median": 0.002, "mean": 0.002, "stddev": 0.0001,
                       "iqr": 0.0002, "data": [0.001, 0.002, 0.003]}},
            {"name": "test_naive", "params": {"kernel": "naive", "case_id": CASE.id},
             "stats": {"min": 0.01, "median": 0.02, "mean": 0.02, "stddev": 0.001}},
        ],
    }


def test_pytest_benchmark_json_maps_kernel_case_and_samples(tmp_path):
    rec = record_from_benchmark_json(_bench_json())
    a, b = rec.results
    assert (a["kernel"], a["case_id"]) == ("fa2", CASE.id)
    assert a["samples_ms"] == pytest.approx([1.0, 2.0, 3.0]) and a["median_ms"] == 2.0
    assert a["tflops"] == pytest.approx(2e9 / 2e-3 / 1e12)
    assert b["kernel"] == "naive" and b["samples_ms"] == [] and b["median_ms"] == 20.0
    assert rec.gpu_model_key == "nvidia-h200" and rec.source == "benchmark"
    assert rec.uuid == record_from_benchmark_json(_bench_json()).uuid  # idempotent import
    bad = _bench_json()
    del bad["benchmarks"][1]["params"]["kernel"]
    with pytest.raises(RecordError, match=r"benchmarks\[1\].*no kernel"):
        record_from_benchmark_json(bad)


def test_cli_import_refuses_invalid_file_and_stores_nothing(tmp_path, capsys):
    db = tmp_path / "r.sqlite"
    good = make_record(specs_for()).write(tmp_path / "good.json")
    bad_data = make_record(specs_for(), seed=2).to_dict()
    del bad_data["results"][2]["tflops"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(bad_data))
    assert cli_main(["import", str(good), str(bad), "--db", str(db)]) == 2
    assert "results[2].tflops: missing" in capsys.readouterr().err
    assert not db.exists()  # validated before the database was even opened
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(_bench_json()))
    assert cli_main(["import", str(good), str(bench), "--db", str(db)]) == 0
    assert cli_main(["import", str(tmp_path / "good.json"), "--db", str(db)]) == 0
    assert "already stored" in capsys.readouterr().out


def test_cli_import_directory_skips_files_that_are_not_records(tmp_path, capsys):
    """A results folder holds a README, logs, archives and other tools' JSON next to the
    records: those are skipped with a note; the records (also in sub-folders) are stored."""
    from sqlalchemy import create_engine, text

    res = tmp_path / "results"
    (res / "2026-12").mkdir(parents=True)
    make_record(specs_for(), seed=1).write(res / "perf-fp16.json")
    make_record(specs_for(), seed=2).write(res / "2026-12" / "decode.json")
    (res / "README.md").write_text("# H200 records\n")
    (res / "h200-session.tgz").write_bytes(b"\x1f\x8b\x08\x00")
    (res / "perf.log").write_text("== perf: rc=0\n")
    (res / "timing_noise.json").write_text(json.dumps({"cases": [], "cv": 0.01}))
    db = tmp_path / "r.sqlite"
    assert cli_main(["import", str(res), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    for name in ("README.md", "h200-session.tgz", "perf.log", "timing_noise.json"):
        assert f"{res / name}: skipped" in out, out
    assert "2 new run(s), 0 already stored" in out
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as c:
        assert c.execute(text("SELECT COUNT(*) FROM runs")).scalar() == 2
    engine.dispose()

    # A broken record in the folder still fails the whole import, storing nothing more.
    bad = make_record(specs_for(), seed=3).to_dict()
    del bad["uuid"]
    (res / "broken.json").write_text(json.dumps(bad))
    assert cli_main(["import", str(res), "--db", str(tmp_path / "other.sqlite")]) == 2
    assert "broken.json" in capsys.readouterr().err
    assert not (tmp_path / "other.sqlite").exists()
    # A folder with no record at all, or a non-record named explicitly: exit 2.
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("nothing yet\n")
    assert cli_main(["import", str(empty), "--db", str(db)]) == 2
    assert "no run records in" in capsys.readouterr().err
    assert cli_main(["import", str(res / "timing_noise.json"), "--db", str(db)]) == 2
