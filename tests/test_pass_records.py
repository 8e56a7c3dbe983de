"""The pass (forward / backward) through records, the database and `compare`: a
candidate's backward is an entry of its own, and records written before the backward
existed still import (as forward results), also into a database created at the schema
before the pass column."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import realdata
from sqlalchemy import select

from harness.core.cases import Case, MaskKind
from harness.core.results import CaseResult, Status, Timing
from harness.records import validate as validate_mod
from harness.records.compare import compare_records
from harness.records.db import migrate
from harness.records.db.engine import make_engine
from harness.records.db.models import Result
from harness.records.db.store import load_record, open_db, store_comparisons, store_record
from harness.records.record import RunRecord, entry_pass

RESULTS = Path(__file__).resolve().parents[1] / "results"
CASE = Case(4, 16, 16, 4096, 4096, 128, "float16", MaskKind.CAUSAL_BR)


def _res(kernel: str, pass_name: str, ms: float) -> CaseResult:
    r = CaseResult(kernel, CASE, Status.PASSED,
                   timing=Timing(samples_ms=[ms * (1 + 0.001 * i) for i in range(20)],
                                 median_ms=ms), extra={"pass": pass_name} if pass_name != "fwd"
                   else {})
    return r


def _record(fwd_ms: float, bwd_ms: float, **meta) -> RunRecord:
    meta = {"commit": "c" * 40, "parent": None, "branch": "main", "source": "cli",
            "gpu": {"name": "NVIDIA H200", "model_key": "nvidia-h200"}, "env": {},
            "grids": ["perf"], **meta}
    return RunRecord.from_results([_res("fa2_mma", "fwd", fwd_ms),
                                   _res("fa2_mma", "bwd", bwd_ms)], meta)


def test_forward_and_backward_are_separate_entries_and_verdicts():
    base = _record(1.0, 2.5)
    assert [entry_pass(e) for e in base.results] == ["fwd", "bwd"]
    assert all("pass" not in (e.get("extra") or {}) for e in base.results)
    assert validate_mod.validate(base.to_dict()) == []
    # Only the backward got 10% slower: one regression, of the backward.
    new = _record(1.0, 2.75, uuid=str(uuid.uuid4()))
    report = compare_records(base, new)
    by = {v.label: v.verdict for v in report.verdicts}
    assert by == {"fa2_mma": "same", "fa2_mma (bwd)": "regression"}, by
    assert "`fa2_mma (bwd)`" in report.markdown()


def test_a_duplicate_is_per_pass():
    rec = _record(1.0, 2.0).to_dict()
    assert validate_mod.validate(rec) == []
    rec["results"].append(dict(rec["results"][1]))
    problems = validate_mod.validate(rec)
    assert any("duplicate" in p and "bwd" in p for p in problems), problems


def test_committed_records_before_the_backward_read_as_forward():
    paths = sorted(RESULTS.glob("h200-*.json"))
    assert paths
    old = 0
    for p in paths:
        data = json.loads(p.read_text())
        passes = {entry_pass(e) for e in data["results"]}
        if "perf-bwd" in data["grids"]:
            assert passes == {"bwd"} and all(e["pass"] == "bwd" for e in data["results"])
        elif all("pass" not in e for e in data["results"]):
            assert passes == {"fwd"}  # written before the pass existed: forward results
            old += 1
        else:  # written since: every entry names its pass (a gate's run has both)
            assert all(e.get("pass") in ("fwd", "bwd") for e in data["results"])
            if "ci" in p.name:
                assert passes == {"fwd", "bwd"}
    assert old >= 10


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'r.sqlite'}"
    return request.getfixturevalue("pg_url")


def test_database_keeps_both_passes_and_exports_losslessly(url):
    rec = _record(1.0, 2.5)
    with open_db(url) as db:
        run_id = store_record(db, rec)
        with db.session() as s:
            rows = s.execute(select(Result.pass_name).where(Result.run_id == run_id)).all()
        assert sorted(r[0] for r in rows) == ["bwd", "fwd"]
        assert load_record(db, run_id).to_dict() == rec.to_dict()
        new = _record(1.0, 2.75, uuid=str(uuid.uuid4()))
        new_id = store_record(db, new)
        verdicts = compare_records(rec, new).verdicts
        assert store_comparisons(db, new_id, run_id, verdicts) == 2


def test_upgrade_from_the_schema_before_the_pass(tmp_path):
    """A database made at revision 0001 with a committed H200 record in it: upgraded, its
    rows are forward results, its results export unchanged, and a backward can be added."""
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    engine = make_engine(url)
    migrate.upgrade(engine, "0001")
    engine.dispose()
    old = RunRecord.from_dict(json.loads(sorted(RESULTS.glob("h200-*-perf.json"))[0]
                                         .read_text()))
    with open_db(url, upgrade=True) as db:
        run_id = store_record(db, old)
        assert load_record(db, run_id).results == old.results
        with db.session() as s:
            passes = {r[0] for r in s.execute(select(Result.pass_name)).all()}
        assert passes == {"fwd"}
        store_record(db, _record(1.0, 2.0))


def test_an_infinite_gradient_error_is_recorded_not_refused():
    """A backward that writes NaN into dQ has error ratio inf in its per-gradient detail:
    the record keeps it as the string "inf" (JSON has no inf), and stays valid."""
    r = CaseResult("sdpa_cudnn", CASE, Status.FAILED, "dq: non-finite",
                   extra={"pass": "bwd", "grad_errors": {"dq": {"ratio": float("inf"),
                                                                "err": float("nan")}}})
    rec = RunRecord.from_results([r], {"commit": None, "parent": None, "branch": None,
                                       "gpu": None, "env": {}})
    assert validate_mod.validate(rec.to_dict()) == []
    assert rec.results[0]["extra"]["grad_errors"]["dq"] == {"ratio": "inf", "err": "nan"}


def test_dashboard_keeps_the_committed_backward_apart(tmp_path_factory):
    """The committed H200 records imported: the perf-bwd run's fa2_mma is "fa2_mma (bwd)"
    on every page, and a case both grids hold has one series per pass."""
    from harness.dashboard import queries
    from harness.records.db.engine import make_engine

    # The sample of the committed records (realdata.SAMPLE), imported once per session.
    url = realdata.shared("sample", tmp_path_factory)
    engine = make_engine(url)
    names = queries.variant_names(engine)
    assert {"fa2_mma", "fa2_mma (bwd)", "triton_fa2 (bwd)", "sdpa_flash (bwd)"} <= set(names)
    case_id = "b4h16-4096x4096-d128-fp16-none"
    fwd = queries.series(engine, "fa2_mma", case_id, "nvidia-h200")
    bwd = queries.series(engine, "fa2_mma (bwd)", case_id, "nvidia-h200")
    assert len(bwd) == 1 and len(fwd) >= 1
    assert set(bwd["run_id"]).isdisjoint(fwd["run_id"])
    # The backward does 2.5x the forward's FLOPs.
    assert int(bwd["flops"].iloc[0]) == int(2.5 * fwd["flops"].iloc[-1])
    engine.dispose()
