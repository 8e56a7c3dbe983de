"""One worker per GPU: the lock per GPU UUID (flock on one host, an advisory lock on a
PostgreSQL queue), NVML's view of other processes, and what a shared GPU does to a job.
NVML is a fake (tests/fake_nvml.py); the locks, processes and databases are real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from fake_nvml import FakeNvml, install
from sqlalchemy import select

from harness.measure import gpuinfo
from harness.records.db import open_db
from harness.records.db.models import Submission
from harness.submissions import fleet, gpulock
from harness.submissions.worker import WorkerConfig, work

UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
SCORER = "tests.test_worker:fake_scorer"


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    install(monkeypatch)
    assert [g.uuid for g in gpuinfo.visible_gpus()] == [UUID_A, UUID_B]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [g.index for g in gpuinfo.visible_gpus()] == [1]
    assert gpuinfo.resolve_gpu(0).uuid == UUID_B  # a position among the visible ones
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,7,0")  # CUDA stops at "7"
    assert [g.uuid for g in gpuinfo.visible_gpus()] == [UUID_A]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpuinfo.resolve_gpu("GPU-bbbb").uuid == UUID_B
    with pytest.raises(ValueError, match="only 2 GPU"):
        gpuinfo.resolve_gpu(7)
    with pytest.raises(ValueError, match="not visible"):
        gpuinfo.resolve_gpu("GPU-cccc")
    with pytest.raises(ValueError, match="expected an index"):
        gpuinfo.resolve_gpu("first")


def test_no_nvml_is_one_line(monkeypatch):
    def broken():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setattr(gpuinfo, "_nvml", broken)
    with pytest.raises(RuntimeError, match="^NVML unavailable .libnvidia-ml"):
        gpuinfo.visible_gpus()
    with pytest.raises(RuntimeError, match="cannot list processes"):
        gpuinfo.compute_processes(UUID_A)


_HOLDER = """
import sys, time
from harness.submissions import gpulock
lock = gpulock.acquire(sys.argv[1], owner="holder")
print("locked", flush=True)
time.sleep(60)
"""


def _holder(key: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, key], stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert p.stdout.readline().strip() == "locked"
    return p


def test_second_worker_on_a_gpu_is_refused_until_the_holder_dies():
    holder = _holder(UUID_A)
    try:
        with pytest.raises(gpulock.GpuBusy, match=r"GPU GPU-aaaa.*held by holder"):
            gpulock.acquire(UUID_A)
        with gpulock.acquire(UUID_B):  # another GPU is free
            pass
        t0 = time.monotonic()
        with pytest.raises(gpulock.GpuBusy):
            gpulock.acquire(UUID_A, wait=True, timeout_s=0.5, poll_s=0.1)
        assert time.monotonic() - t0 >= 0.5
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean-up runs: the kernel frees the flock
        holder.wait()
    lock = gpulock.acquire(UUID_A, wait=True, timeout_s=10, poll_s=0.1)
    lock.release()


@pytest.mark.postgres
def test_advisory_lock_covers_workers_that_share_no_lock_directory(pg_url, tmp_path):
    import uuid

    from harness.records.db import make_engine

    # Advisory locks are per database, not per schema: a GPU of this test only, since
    # other test runs share the server.
    gpu = f"GPU-{uuid.uuid4()}"
    e1, e2 = make_engine(pg_url), make_engine(pg_url)
    try:
        first = gpulock.acquire(gpu, engine=e1, directory=tmp_path / "container1")
        with pytest.raises(gpulock.GpuBusy, match="PostgreSQL advisory lock"):
            gpulock.acquire(gpu, engine=e2, directory=tmp_path / "container2")
        first.release()
        gpulock.acquire(gpu, engine=e2, directory=tmp_path / "container2").release()
    finally:
        e1.dispose()
        e2.dispose()


# ------------------------------------------------------------------ the worker's checks


@pytest.fixture
def db(tmp_path):
    d = open_db(str(tmp_path / "w.sqlite"))
    yield d
    d.close()


def _add(db, mode: str = "ok") -> int:
    with db.session() as s:
        row = Submission(name=mode, submitter="t", source=json.dumps({"mode.txt": mode}),
                         source_hash=mode, status="queued")
        s.add(row)
        s.flush()
        return row.id


def _config(tmp_path, **kw) -> WorkerConfig:
    base = dict(gpu=0, case_timeout_s=20.0, job_timeout_s=60.0, memory_limit_mb=800,
                gpu_memory_fraction=None, scorer=SCORER, secret=1, poll_s=0.05,
                busy_wait_s=5.0, scoring={"baseline": "sdpa_flash"},
                events=str(tmp_path / "events.jsonl"))
    base.update(kw)
    return WorkerConfig(**base)


def _sharer(nvml: FakeNvml, on_attempts: set[int]):
    """A log callback that puts a foreign process on GPU A from the claim of the given
    attempts on (the worker logs each claim before it looks at the GPU)."""
    foreign = subprocess.Popen(["sleep", "60"])

    def log(msg: str) -> None:
        if "scoring, attempt" in msg:
            attempt = int(msg.rsplit(" ", 1)[1])
            nvml.procs[UUID_A] = [foreign.pid] if attempt in on_attempts else []
    return log, foreign


def _row(db, sid: int) -> Submission:
    with db.sessions() as s:
        return s.scalars(select(Submission).where(Submission.id == sid)).one()


def test_job_timed_on_a_shared_gpu_is_requeued_then_scored_clean(db, tmp_path, monkeypatch):
    nvml = install(monkeypatch)
    sid = _add(db)
    log, foreign = _sharer(nvml, {1})
    try:
        assert work(db.engine, _config(tmp_path), drain=True, log=log) == 1
    finally:
        foreign.kill()
    row = _row(db, sid)
    assert (row.status, row.verdict, row.attempts) == ("done", "scored", 2)
    assert row.detail["gpu_sharing"] == {"uuid": UUID_A, "others_before": 0, "others_during": 0,
                                 "others_after": 0, "shared": False, "nvml_error": None}
    assert row.detail["gpu_sharing"] and str(foreign.pid) not in json.dumps(row.detail)
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["claim", "release", "claim", "finish"]
    assert all(e["gpu"] == UUID_A for e in events)


@pytest.mark.parametrize("how", ["mark", "attempts"])
def test_shared_score_is_marked_when_not_requeued(db, tmp_path, monkeypatch, how):
    nvml = install(monkeypatch)
    sid = _add(db)
    log, foreign = _sharer(nvml, {1, 2, 3})
    kw = {"on_shared": "mark"} if how == "mark" else {"max_attempts": 2}
    try:
        work(db.engine, _config(tmp_path, **kw), drain=True, log=log)
    finally:
        foreign.kill()
    row = _row(db, sid)
    assert row.status == "done" and row.attempts == (1 if how == "mark" else 2)
    assert row.detail["gpu_sharing"]["shared"] is True and row.detail["gpu_sharing"]["others_after"] == 1
    assert row.message.startswith("GPU shared with another process while scored")


def test_worker_waits_for_a_busy_gpu_before_claiming(db, tmp_path, monkeypatch):
    nvml = install(monkeypatch)
    foreign = subprocess.Popen(["sleep", "60"])
    nvml.procs[UUID_A] = [foreign.pid]
    sid = _add(db)
    logs: list[str] = []

    def log(msg: str) -> None:
        logs.append(msg)
        if "waiting before claiming" in msg:  # the other process ends a moment later
            nvml.procs[UUID_A] = []
    try:
        work(db.engine, _config(tmp_path), drain=True, log=log)
    finally:
        foreign.kill()
    assert any("1 other compute process(es)" in m for m in logs)
    row = _row(db, sid)
    assert row.attempts == 1 and row.detail["gpu_sharing"]["shared"] is False


def test_process_seen_while_the_child_runs(db, tmp_path, monkeypatch):
    """A process that comes and goes while the job runs is caught by the sampling."""
    nvml = install(monkeypatch)
    foreign = subprocess.Popen(["sleep", "60"])
    sid = _add(db, "slow")

    def log(msg: str) -> None:
        if "attempt 1" in msg:
            # appears only while the child runs: after the worker's first look
            orig = gpulock.GpuWatch.start

            def start(self):
                orig(self)
                nvml.procs[UUID_A] = [foreign.pid]
            monkeypatch.setattr(gpulock.GpuWatch, "start", start)
            monkeypatch.setattr(gpulock.GpuWatch, "others_now", lambda self: [])
    try:
        work(db.engine, _config(tmp_path, on_shared="mark"), once=True, log=log)
    finally:
        foreign.kill()
    g = _row(db, sid).detail["gpu_sharing"]
    assert g["others_during"] == 1 and g["shared"] is True


def test_worker_refused_on_a_locked_gpu(db, tmp_path, monkeypatch):
    install(monkeypatch)
    holder = _holder(UUID_A)
    try:
        with pytest.raises(gpulock.GpuBusy):
            work(db.engine, _config(tmp_path), drain=True)
        from harness.cli import main

        rc = main(["worker", "--db", str(tmp_path / "w.sqlite"), "--gpu", "0", "--drain"])
        assert rc == 1
        assert main(["worker", "--db", str(tmp_path / "w.sqlite"), "--gpu", "5"]) == 2
    finally:
        holder.kill()
        holder.wait()


def test_gpu_all_starts_one_pinned_worker_per_gpu(monkeypatch, tmp_path):
    install(monkeypatch)
    started = []

    class P:
        def __init__(self, cmd, **_kw):
            started.append(cmd)
            self.pid = 100 + len(started)

        def wait(self):
            return 0

        def send_signal(self, _sig):
            pass

    import argparse

    from harness.cli import build_parser
    from harness.cli.cmd_worker import _argv

    args = build_parser().parse_args(["worker", "--gpu", "all", "--drain", "--db", "x.db",
                                      "--quick", "--case-timeout", "30"])
    argv = _argv(args)
    assert argv[0] == "worker" and "--drain" in argv and "--gpu" not in argv
    assert argv[argv.index("--case-timeout") + 1] == "30.0"
    rc = fleet.launch(argv, gpuinfo.visible_gpus(), popen=P)
    assert rc == 0 and len(started) == 2
    assert [c[-1] for c in started] == [UUID_A, UUID_B]
    assert all(c[1:3] == ["-m", "harness"] and c[-2] == "--gpu" for c in started)
    assert fleet.worker_argv(["worker", "--gpu=all", "--once"], "U") == \
        ["worker", "--once", "--gpu", "U"]
    reparsed = build_parser().parse_args(started[0][3:])
    assert isinstance(reparsed, argparse.Namespace) and reparsed.gpu == UUID_A
    assert reparsed.drain and reparsed.quick and reparsed.case_timeout == 30.0
