"""Several worker processes on one queue (SQLite and the CI PostgreSQL), each on its own
(pretend) GPU with its lock: no job is claimed twice, every job is finished once, and a
worker killed with SIGKILL mid-job has its job re-queued and finished by another worker:
on SQLite (one host) as soon as its pid is gone, on PostgreSQL once its lease (renewed by
heartbeats, on the database's clock) has expired. The scorer is the fake of
tests/test_worker.py; the worker processes, their scoring children, the locks and the
databases are real. (tests/test_worker_drill.py adds dropped connections, outages and
SIGSTOP.)"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from harness.records.db import open_db
from harness.records.db.models import Submission

SCORER = "tests.test_worker:fake_scorer"
N_JOBS = 8
N_WORKERS = 3


# The lease outlasts the job limit; short, so that the killed worker's job comes back soon.
JOB_TIMEOUT_S, LEASE_S = 20.0, 24.0


def _worker(url: str, gpu: str, events: str, stop: str) -> None:
    from harness.submissions.worker import WorkerConfig, work

    db = open_db(url)
    config = WorkerConfig(gpu=gpu, case_timeout_s=JOB_TIMEOUT_S, startup_timeout_s=120.0,
                          job_timeout_s=JOB_TIMEOUT_S, lease_s=LEASE_S, heartbeat_s=1.0,
                          memory_limit_mb=2000, gpu_memory_fraction=None, scorer=SCORER,
                          secret=7, poll_s=0.1, scoring={"baseline": "sdpa_flash"},
                          events=events)
    work(db.engine, config, should_stop=lambda: os.path.exists(stop))
    db.close()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'q.sqlite'}"
    return request.getfixturevalue("pg_url")


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _rows(db) -> dict[int, Submission]:
    with db.sessions() as s:
        return {r.id: r for r in s.scalars(select(Submission))}


@pytest.mark.slow
def test_workers_claim_each_job_once_and_a_killed_workers_job_is_finished_elsewhere(
        url, tmp_path):
    db = open_db(url)
    with db.session() as s:
        rows = [Submission(name=f"j{i}", submitter="t", status="queued",
                           source=json.dumps({"mode.txt": "slow", "sleep.txt": "1.0"}),
                           source_hash=str(i)) for i in range(N_JOBS)]
        s.add_all(rows)
        s.flush()
        ids = [r.id for r in rows]
    events = tmp_path / "events.jsonl"
    # GPUs of this test only: on PostgreSQL the GPU locks are advisory locks of the whole
    # database, which other test runs share.
    gpus = [f"GPU-{uuid.uuid4()}" for _ in range(1 + N_WORKERS)]
    ctx = mp.get_context("fork")
    stop = str(tmp_path / "stop")
    victim = ctx.Process(target=_worker, args=(url, gpus[0], str(events), stop))
    victim.start()
    deadline = time.monotonic() + 120
    while not any(e["event"] == "claim" for e in _events(events)):
        assert time.monotonic() < deadline, "the first worker claimed nothing"
        time.sleep(0.05)
    time.sleep(0.3)  # its scoring child is running now
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    killed_job = next(e["id"] for e in _events(events) if e["event"] == "claim")

    others = [ctx.Process(target=_worker, args=(url, g, str(events), stop))
              for g in gpus[1:]]
    for p in others:
        p.start()
    deadline = time.monotonic() + 240
    while not all(r.status == "done" for r in _rows(db).values()):
        assert time.monotonic() < deadline, "the jobs were not all finished"
        time.sleep(0.2)
    Path(stop).touch()
    for p in others:
        p.join(60)
        assert p.exitcode == 0
    ev = _events(events)
    claims = Counter((e["id"], e["attempt"]) for e in ev if e["event"] == "claim")
    assert all(n == 1 for n in claims.values()), "a job attempt was claimed twice"
    finished = Counter(e["id"] for e in ev if e["event"] == "finish" and e["stored"])
    assert sorted(finished) == sorted(ids) and set(finished.values()) == {1}
    assert any(e["event"] == "requeued" and e["id"] == killed_job for e in ev)
    second = [e for e in ev if e["event"] == "claim" and e["id"] == killed_job]
    assert [e["attempt"] for e in second] == [1, 2]
    assert second[0]["worker"] != second[1]["worker"]
    rows = _rows(db)
    db.close()
    assert all(r.status == "done" and r.verdict == "scored" for r in rows.values())
    assert rows[killed_job].attempts == 2
    # Each job's child ran pinned to its worker's GPU (no NVML here: as given).
    by_worker = {e["worker"] for e in ev if e["event"] == "finish"}
    assert len(by_worker) >= 2, "the work was spread over several workers"
    assert {r.detail["gpu"] for r in rows.values()} <= set(gpus[1:])


def test_the_launcher_restarts_a_dead_worker_but_not_a_host_that_cannot_score():
    """`worker --gpu all` supervises: a worker killed by a signal or ended by an error is
    started again (after a pause); exit 0 (stopped), 2 (usage) and 4 (this host cannot
    score) are final."""
    from harness.measure.gpuinfo import VisibleGpu
    from harness.submissions import fleet

    script = {"A": [-9, 1, 0], "B": [4]}  # what each GPU's successive workers exit with
    started: list[str] = []

    class P:
        def __init__(self, cmd, **_kw):
            self.uuid = cmd[-1]
            started.append(self.uuid)
            self.pid = len(started)

        def wait(self):
            return script[self.uuid].pop(0)

        def send_signal(self, _sig):
            pass

    gpus = [VisibleGpu(index=i, uuid=u, name="fake") for i, u in enumerate("AB")]
    logs: list[str] = []
    rc = fleet.launch(["worker"], gpus, popen=P, log=logs.append, first_pause_s=0.01)
    assert sorted(started) == ["A", "A", "A", "B"]
    assert script == {"A": [], "B": []}
    assert rc == 4
    assert sum("starting it again" in m for m in logs) == 2


@pytest.mark.postgres
def test_a_gpu_lock_lost_with_its_connection_is_taken_again(pg_url, tmp_path):
    """The database half of a GPU lock is a session advisory lock, which a dropped
    connection loses silently: between jobs the worker checks it (`keep`), takes it again,
    and stops (GpuBusy) if a worker elsewhere took the GPU meanwhile."""
    from sqlalchemy import text

    from harness.submissions import gpulock

    db = open_db(pg_url)
    key = f"GPU-{uuid.uuid4()}"
    lock = gpulock.acquire(key, engine=db.engine, directory=tmp_path / "here")
    pid = lock.pg_conn.execute(text("SELECT pg_backend_pid()")).scalar()
    lock.pg_conn.commit()
    with db.engine.begin() as c:  # the connection is cut: the server ends the session
        c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    # A worker of another host (its own lock files) now gets the GPU.
    other = gpulock.acquire(key, engine=db.engine, directory=tmp_path / "elsewhere",
                            wait=True, timeout_s=10, poll_s=0.1)
    with pytest.raises(gpulock.GpuBusy, match="another worker holds it now"):
        lock.keep()
    other.release()
    lock.keep()  # free again: taken back, and held
    with pytest.raises(gpulock.GpuBusy):
        gpulock.acquire(key, engine=db.engine, directory=tmp_path / "third")
    lock.release()
    db.close()
