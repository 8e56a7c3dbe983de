"""A worker scores only under its lease (harness.submissions.lease): an expired lease is
never renewed, even while the job is still its claim; past its local bound the lease is
asked of the database, and lost when the database says so or cannot be reached; the
scoring child stops at the first step its worker does not allow, scoring nothing more."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

import harness.submissions.lease as lease_mod
from harness.records.db import open_db
from harness.records.db.models import Submission, utcnow
from harness.submissions.lease import Lease
from harness.submissions.queue import ERROR, claim, heartbeat, requeue_stale
from harness.submissions.worker import WorkerConfig, run_job

SCORER = "tests.test_worker_lease:counting_scorer"


def counting_scorer(files, options, *, secret, progress):
    """Three cases; notes each case it ran and, at the end, that it scored."""
    from harness.submissions.scoring import ScoreReport

    notes = Path(files["notes.txt"])
    for i in range(3):
        progress("check", f"case-{i}")
        with open(notes, "a") as f:
            f.write(f"case-{i}\n")
    with open(notes, "a") as f:
        f.write("scored\n")
    return ScoreReport("scored", "fine", score=1.0)


@pytest.fixture
def db(tmp_path):
    d = open_db(str(tmp_path / "q.sqlite"))
    yield d
    d.close()


def _claimed(db, worker: str = "w"):
    with db.session() as s:
        s.add(Submission(name="j", submitter="t", source="{}", source_hash="j",
                         status="queued"))
    return claim(db.engine, worker)


def _age(db, job, seconds: float) -> None:
    with db.session() as s:
        s.get(Submission, job.id).heartbeat_at = utcnow() - timedelta(seconds=seconds)


def test_an_expired_lease_is_not_renewed_even_while_still_this_claim(db):
    job = _claimed(db)
    assert heartbeat(db.engine, job, lease_s=60)
    _age(db, job, 90)  # the worker was stopped for 90 s; nobody re-queued it yet
    assert not heartbeat(db.engine, job, lease_s=60)
    assert requeue_stale(db.engine, lease_s=60, max_attempts=3).requeued == [job.id]
    other = claim(db.engine, "w2")
    assert not heartbeat(db.engine, job, lease_s=60)  # taken: another token
    assert not heartbeat(db.engine, job)
    assert heartbeat(db.engine, other, lease_s=60)


def test_past_its_local_bound_the_lease_is_asked_of_the_database(db, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(lease_mod, "clock", lambda: now[0])
    job = _claimed(db)
    logs: list[str] = []
    lease = Lease(db.engine, job, lease_s=60, interval_s=3600, log=logs.append)
    assert lease.held() and lease.until < 1060
    now[0] += 61  # past the bound, the lease still fresh on the database: renewed
    assert lease.held() and lease.until > now[0] + 50
    now[0] += 61
    _age(db, job, 61)  # expired by the database's clock: lost, for good
    assert not lease.held() and lease.lost.is_set() and "expired" in lease.why
    _age(db, job, 0)
    assert not lease.held()
    assert any("lease lost" in m for m in logs)


def test_a_lease_that_cannot_be_confirmed_is_lost(db, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(lease_mod, "clock", lambda: now[0])
    job = _claimed(db)

    def down(*a, **k):
        raise OperationalError("SELECT 1", {}, Exception("connection refused"))

    lease = Lease(db.engine, job, lease_s=60, interval_s=3600, log=lambda m: None)
    monkeypatch.setattr(lease_mod, "heartbeat", down)
    now[0] += 30  # the database gone, the lease still within its bound: go on
    assert lease.held()
    now[0] += 31
    assert not lease.held() and "unreachable" in lease.why


def _config(**kw) -> WorkerConfig:
    base = dict(gpu=None, case_timeout_s=60.0, job_timeout_s=120.0, memory_limit_mb=800,
                gpu_memory_fraction=None, scorer=SCORER, secret=1, poll_s=0.1)
    base.update(kw)
    return WorkerConfig(**base)


@pytest.mark.parametrize("allowed", [0, 2, 4, 5])
def test_the_child_stops_at_the_first_step_its_worker_does_not_allow(db, tmp_path,
                                                                      allowed):
    """Its asks: load, three cases, the result (5). Refused at one of them, the child
    runs nothing more and writes no result; the outcome is no verdict (status error)."""
    notes = tmp_path / "notes.txt"
    job = _claimed(db)
    job = replace(job, files={"notes.txt": str(notes)})
    asked: list[bool] = []

    def gate() -> bool:
        asked.append(len(asked) < allowed)
        return asked[-1]

    out = run_job(job, _config(), gate=gate)
    ran = notes.read_text().split() if notes.exists() else []
    if allowed == 5:
        assert (out.verdict, out.status, out.score) == ("scored", "done", 1.0)
        assert ran == ["case-0", "case-1", "case-2", "scored"]
        return
    assert out.status == ERROR and "lease" in out.message, out
    assert len(asked) == allowed + 1
    assert ran == [f"case-{i}" for i in range(max(0, allowed - 1))] + (
        ["scored"] if allowed == 4 else [])
    assert json.dumps(out.to_dict())  # a plain outcome, nothing of a result in it
