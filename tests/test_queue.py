"""The submission queue: no job claimed twice under concurrent claimers (SQLite and
PostgreSQL), lease expiry re-queues, the attempts cap abandons, stale finishes are refused;
leases on the database's clock renewed by heartbeats, idempotent finishes, jobs the host
could not score re-queued (an infrastructure error only after different workers failed
them), and the board ranking only scores made under the same settings."""

from __future__ import annotations

import os
import threading
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, select, text

from harness.records.db import make_engine, open_db
from harness.records.db.models import Submission, utcnow
from harness.submissions.queue import (
    HOST_ERROR,
    REQUEUED,
    Outcome,
    claim,
    finish,
    heartbeat,
    queue_depth,
    requeue_host_fault,
    requeue_stale,
)

N_JOBS = 60
N_CLAIMERS = 6


def _add_jobs(db, n: int) -> list[int]:
    with db.session() as s:
        rows = [Submission(name=f"job{i}", submitter="t", source="{}", source_hash=str(i),
                           status="queued") for i in range(n)]
        s.add_all(rows)
        s.flush()
        return [r.id for r in rows]


def _race(url: str) -> dict[str, list[int]]:
    """N_CLAIMERS threads, each with its own engine (own connections, as separate worker
    processes would have), released together and claiming until the queue is empty."""
    start = threading.Barrier(N_CLAIMERS)
    results: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def claimer(name: str) -> None:
        engine = make_engine(url)
        got: list[int] = []
        try:
            start.wait()
            while (job := claim(engine, name)) is not None:
                got.append(job.id)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        finally:
            engine.dispose()
            results[name] = got

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(N_CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return results


def _assert_each_claimed_once(db, ids: list[int], results: dict[str, list[int]]) -> None:
    claimed = [j for got in results.values() for j in got]
    assert sorted(claimed) == sorted(ids), "every job claimed exactly once"
    with db.sessions() as s:
        rows = s.scalars(select(Submission)).all()
        assert all(r.status == "running" and r.attempts == 1 for r in rows)
        owner = {j: w for w, got in results.items() for j in got}
        assert all(r.worker == owner[r.id] for r in rows)


@pytest.fixture
def sqlite_db(tmp_path):
    db = open_db(str(tmp_path / "q.sqlite"))
    yield db
    db.close()


@pytest.fixture
def pg_db():
    base = os.environ.get("FA_HARNESS_TEST_PG")
    if not base:
        pytest.skip("FA_HARNESS_TEST_PG not set (PostgreSQL queue test)")
    schema = f"fa_queue_{uuid.uuid4().hex[:8]}"
    admin = create_engine(base)
    try:
        with admin.begin() as c:
            c.execute(text(f"CREATE SCHEMA {schema}"))
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"PostgreSQL not reachable: {e}")
    sep = "&" if "?" in base else "?"
    url = f"{base}{sep}options=-csearch_path%3D{schema}"
    db = open_db(url, upgrade=True)
    yield db
    db.close()
    with admin.begin() as c:
        c.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    admin.dispose()


def test_concurrent_claimers_sqlite(sqlite_db):
    ids = _add_jobs(sqlite_db, N_JOBS)
    results = _race(sqlite_db.url)
    _assert_each_claimed_once(sqlite_db, ids, results)
    assert claim(sqlite_db.engine, "late") is None


@pytest.mark.postgres
def test_concurrent_claimers_postgres(pg_db):
    ids = _add_jobs(pg_db, N_JOBS)
    results = _race(pg_db.url)
    _assert_each_claimed_once(pg_db, ids, results)
    # SKIP LOCKED spreads the work: more than one claimer got jobs.
    assert sum(1 for got in results.values() if got) > 1


def test_claim_order_and_finish(sqlite_db):
    ids = _add_jobs(sqlite_db, 3)
    job = claim(sqlite_db.engine, "w")
    assert job.id == ids[0] and job.attempts == 1
    assert finish(sqlite_db.engine, job, Outcome("scored", "ok", score=1.25,
                                                 detail={"x": 1}))
    with sqlite_db.sessions() as s:
        row = s.get(Submission, ids[0])
        assert (row.status, row.verdict, row.score) == ("done", "scored", 1.25)
        assert row.finished_at is not None
    assert queue_depth(sqlite_db.engine) == {"done": 1, "queued": 2}


def test_lease_requeue_attempts_cap_and_lost_claim(sqlite_db):
    (sid,) = _add_jobs(sqlite_db, 1)
    first = claim(sqlite_db.engine, "dead-worker")
    # Not stale yet: nothing happens.
    assert requeue_stale(sqlite_db.engine, lease_s=60, max_attempts=2).requeued == []
    later = utcnow() + timedelta(seconds=120)
    rq = requeue_stale(sqlite_db.engine, lease_s=60, max_attempts=2, now=later)
    assert rq.requeued == [sid] and rq.abandoned == []
    second = claim(sqlite_db.engine, "w2")
    assert second.id == sid and second.attempts == 2
    # The presumed-dead worker comes back: its result must not overwrite the new attempt.
    assert not finish(sqlite_db.engine, first, Outcome("scored", "stale", score=99.0))
    # The second worker dies too: attempts cap reached, abandoned with a clear verdict.
    rq = requeue_stale(sqlite_db.engine, lease_s=60, max_attempts=2,
                       now=utcnow() + timedelta(seconds=120))
    assert rq.abandoned == [sid]
    with sqlite_db.sessions() as s:
        row = s.get(Submission, sid)
        assert (row.status, row.verdict) == ("error", "crashed")
        assert "abandoned after 2 attempt(s)" in row.message and row.score is None
    assert claim(sqlite_db.engine, "w3") is None


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_db(request):
    return request.getfixturevalue("sqlite_db" if request.param == "sqlite" else "pg_db")


@pytest.mark.postgres
def test_lease_is_measured_on_the_database_clock(pg_db, monkeypatch):
    """A worker whose own clock runs a day ahead cannot expire a live job's lease; a job
    whose last heartbeat is older than the lease by the database's clock is re-queued,
    and its worker's next heartbeat learns that the claim was lost."""
    import harness.submissions.queue as queue

    (sid,) = _add_jobs(pg_db, 1)
    job = claim(pg_db.engine, "host:1:gpu0")
    monkeypatch.setattr(queue, "utcnow", lambda: utcnow() + timedelta(days=1))
    assert requeue_stale(pg_db.engine, lease_s=60, max_attempts=3).requeued == []
    assert heartbeat(pg_db.engine, job)
    with pg_db.session() as s:  # the last heartbeat, 90 s ago by the database's clock
        s.execute(text("UPDATE submissions SET heartbeat_at = now() - interval '90 seconds'"))
    assert requeue_stale(pg_db.engine, lease_s=120, max_attempts=3).requeued == []
    assert requeue_stale(pg_db.engine, lease_s=60, max_attempts=3).requeued == [sid]
    assert not heartbeat(pg_db.engine, job)
    assert not finish(pg_db.engine, job, Outcome("scored", "late", score=1.0))


def test_a_heartbeat_keeps_a_job_past_its_claim_time(sqlite_db):
    (sid,) = _add_jobs(sqlite_db, 1)
    job = claim(sqlite_db.engine, "w")
    with sqlite_db.session() as s:  # claimed long ago, beaten just now
        s.get(Submission, sid).claimed_at = utcnow() - timedelta(hours=2)
    assert heartbeat(sqlite_db.engine, job)
    assert requeue_stale(sqlite_db.engine, lease_s=60, max_attempts=3).requeued == []


def test_finish_is_idempotent_by_claim_token(any_db):
    """A retry of a store whose commit went through is told it is stored; nothing is
    written twice; another claim of the same job cannot store with the old token."""
    (sid,) = _add_jobs(any_db, 1)
    job = claim(any_db.engine, "w")
    out = Outcome("scored", "ok", score=1.25, backward=Outcome("scored", "b", score=2.0))
    assert finish(any_db.engine, job, out)
    assert finish(any_db.engine, job, out)  # the retry
    assert not finish(any_db.engine, job, Outcome("scored", "other", score=3.0))
    with any_db.sessions() as s:
        row = s.get(Submission, sid)
        assert (row.status, row.score, row.message) == ("done", 1.25, "ok")
        n = s.execute(text("SELECT count(*) FROM submission_passes")).scalar_one()
    assert n == 1


def test_a_job_the_host_could_not_score_is_no_verdict(any_db):
    """Re-queued with its fault remembered; not claimed again where it failed; an
    infrastructure error (no verdict) once it failed on two different workers; its
    attempts are not held against the submitter."""
    (sid,) = _add_jobs(any_db, 1)
    a = claim(any_db.engine, "hostA:11:gpu0")
    assert requeue_host_fault(any_db.engine, a, "no usable CUDA GPU", limit=2) == REQUEUED
    with any_db.sessions() as s:
        row = s.get(Submission, sid)
        assert (row.status, row.verdict, row.worker) == ("queued", None, None)
        assert "hostA:11:gpu0 could not score it" in row.message
    # The same host and GPU, restarted (another pid): passed over.
    assert claim(any_db.engine, "hostA:12:gpu0") is None
    b = claim(any_db.engine, "hostB:13:gpu0")
    assert b is not None and b.id == sid and len(b.host_faults) == 1
    # Two attempts, one of them the host's: not yet the two the submitter is allowed.
    assert requeue_stale(any_db.engine, lease_s=60, max_attempts=2,
                         now=utcnow() + timedelta(seconds=120)).requeued == [sid]
    c = claim(any_db.engine, "hostB:13:gpu0")
    assert requeue_host_fault(any_db.engine, c, "CUDA driver version is insufficient",
                              limit=2) == HOST_ERROR
    with any_db.sessions() as s:
        row = s.get(Submission, sid)
        assert (row.status, row.verdict, row.score) == ("error", None, None)
        assert row.message.startswith("infrastructure error, not a verdict")
        assert [f["place"] for f in row.detail["host_faults"]] == ["hostA:gpu0", "hostB:gpu0"]


def test_the_board_ranks_only_scores_made_under_the_same_settings(sqlite_db):
    from harness.submissions.ranking import leaderboard_rows

    ids = _add_jobs(sqlite_db, 3)
    quick = {"baseline": "sdpa_flash", "perf_grid": "perf", "quick": True}
    full = {**quick, "quick": False}
    for sid, score, settings in zip(ids, (9.0, 1.5, 1.2), (quick, full, full), strict=True):
        job = claim(sqlite_db.engine, "w")
        assert job.id == sid
        assert finish(sqlite_db.engine, job, Outcome("scored", "ok", score=score,
                                                     detail={"settings": settings}))
    board = leaderboard_rows(sqlite_db.engine, include_all=True)
    assert [(r["id"], r["rank"]) for r in board] == [(ids[1], 1), (ids[2], 2), (ids[0], None)]
    quick_board = leaderboard_rows(sqlite_db.engine, settings=quick)
    assert [(r["id"], r["rank"]) for r in quick_board] == [(ids[0], 1)]
