"""The submission queue: no job claimed twice under concurrent claimers (SQLite and
PostgreSQL), lease expiry re-queues, the attempts cap abandons, stale finishes are refused."""

from __future__ import annotations

import os
import threading
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, select, text

from harness.records.db import make_engine, open_db
from harness.records.db.models import Submission, utcnow
from harness.submissions.queue import Outcome, claim, finish, queue_depth, requeue_stale

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
