"""The worker survives every bad job: hangs, crashes, exceptions, memory hogs, garbage;
and nothing of the host is a verdict: a host without a usable GPU refuses to start, a job
the host could not score goes back to the queue, a result waits in the spool until the
database takes it.

The scoring child is real (a separate process started by `harness.submissions.worker.run_job`); the
scorer it calls is a fake selected through the worker configuration (`fake_scorer`
below), which acts out what a bad submission does to the child process.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from harness.records.db import open_db
from harness.records.db.models import Base, Submission, utcnow
from harness.submissions.queue import claim
from harness.submissions.scoring import ScoreReport
from harness.submissions.worker import WorkerConfig, work

SCORER = "tests.test_worker:fake_scorer"

# A scorer module that is slow to import (a heavy scorer, a loaded machine), when asked:
# the scoring child imports this module to find `fake_scorer`.
time.sleep(float(os.environ.get("FA_TEST_SCORER_IMPORT_S", "0")))


def fake_scorer(files, options, *, secret, progress) -> ScoreReport:
    """Behaves as the job's single file says (runs in the worker's child process)."""
    mode = files["mode.txt"].strip()
    go = os.environ.get("FA_TEST_GO_FILE")
    while go and not os.path.exists(go):  # held back until the test says go
        time.sleep(0.02)
    progress("check", "case-1")
    if mode == "ok":
        env_ok = "FA_HARNESS_SECRET" not in os.environ
        return ScoreReport("scored", "fine", score=1.5,
                           detail={"secret_seen": secret, "env_clean": env_ok,
                                   "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                   "options": options.to_dict()["baseline"]})
    if mode == "slow":  # an honest job that takes a while (files["sleep.txt"] seconds)
        progress("perf", "case-slow")
        time.sleep(float(files.get("sleep.txt", "2.5")))
        return ScoreReport("scored", "fine", score=1.0,
                           detail={"gpu": os.environ.get("CUDA_VISIBLE_DEVICES")})
    if mode == "hang":  # a kernel looping forever: no progress ever again
        progress("perf", "case-hang")
        time.sleep(3600)
    if mode == "segv":  # an illegal address that takes the process down
        progress("check", "case-segv")
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "raise":
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if mode == "hog":  # host memory far past the limit
        progress("check", "case-hog")
        blob = bytearray(1200 * 2**20)
        for i in range(0, len(blob), 4096):
            blob[i] = 1
        time.sleep(60)
    if mode == "exit":
        os._exit(3)
    if mode == "nogpu":  # what the real scorer says on a host without a usable GPU
        return ScoreReport("crashed", "this worker has no usable CUDA GPU; the submission "
                           "was not run", status="error")
    raise AssertionError(f"unknown mode {mode}")


@pytest.fixture
def db(tmp_path):
    d = open_db(str(tmp_path / "w.sqlite"))
    yield d
    d.close()


def _add(db, mode: str) -> int:
    with db.session() as s:
        row = Submission(name=mode, submitter="t", source=json.dumps({"mode.txt": mode}),
                         source_hash=mode, status="queued")
        s.add(row)
        s.flush()
        return row.id


def _counts(engine) -> dict[str, int]:
    with engine.connect() as c:
        return {t.name: c.execute(select(func.count()).select_from(t)).scalar_one()
                for t in Base.metadata.sorted_tables if t.name != "submissions"}


def _config(**kw) -> WorkerConfig:
    base = dict(gpu=3, case_timeout_s=6.0, job_timeout_s=120.0, memory_limit_mb=800,
                gpu_memory_fraction=None, scorer=SCORER, secret=424242,
                scoring={"baseline": "sdpa_flash"}, poll_s=0.1)
    base.update(kw)
    return WorkerConfig(**base)


def test_worker_survives_every_bad_job(db):
    modes = ["hang", "segv", "raise", "hog", "exit", "ok"]
    ids = {m + str(i): _add(db, m) for i, m in enumerate(modes)}
    before = _counts(db.engine)
    logs: list[str] = []
    n = work(db.engine, _config(), drain=True, log=logs.append)
    assert n == len(modes)
    with db.sessions() as s:
        rows = {r.id: r for r in s.scalars(select(Submission))}
    v = {key: rows[sid] for key, sid in ids.items()}
    assert all(r.status == "done" and r.finished_at is not None for r in rows.values())

    assert v["hang0"].verdict == "timeout"
    assert "case-hang" in v["hang0"].message and "no progress for 6 s" in v["hang0"].message
    assert v["hang0"].failing_cases[0]["case"] == "case-hang"

    # The last job, after every bad one, is scored normally by the same worker.
    ok = v["ok5"]
    assert (ok.verdict, ok.score) == ("scored", 1.5)
    assert ok.detail["secret_seen"] == 424242 and ok.detail["env_clean"]
    assert ok.detail["gpu"] == "3" and ok.detail["options"] == "sdpa_flash"

    assert v["segv1"].verdict == "crashed"
    assert "SIGSEGV" in v["segv1"].message and "case-segv" in v["segv1"].message

    assert v["raise2"].verdict == "crashed"
    assert "illegal memory access" in v["raise2"].message

    assert v["hog3"].verdict == "crashed" and "above the limit of 800 MiB" in v["hog3"].message

    assert v["exit4"].verdict == "crashed" and "exited with code 3" in v["exit4"].message
    assert _counts(db.engine) == before  # nothing but the submissions table changed
    assert any("timeout" in line for line in logs)


def test_a_crash_between_two_samples_is_blamed_on_its_case(db, monkeypatch, tmp_path):
    """A child that writes its last progress lines and dies while the watchdog is busy
    elsewhere (reading the memory takes a pgrep: slow on a loaded machine) is still blamed
    on the case it was on, read from the progress file it left, not on an earlier sample."""
    import harness.submissions.worker_run as worker

    go = tmp_path / "go"
    monkeypatch.setenv("FA_TEST_GO_FILE", str(go))

    def rss_once_dead(pid: int) -> float:
        """After the watchdog's first look at the progress: let the child go, return only
        once it is dead (not yet reaped), so the watchdog never sees its last lines."""
        go.touch()
        give_up = time.monotonic() + 120
        # WNOWAIT: see the exit without reaping it, so the watchdog's poll() still does.
        while time.monotonic() < give_up and os.waitid(
                os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            time.sleep(0.05)
        return 0.0

    monkeypatch.setattr(worker, "_rss_mb", rss_once_dead)
    _add(db, "segv")
    work(db.engine, _config(), once=True)
    with db.sessions() as s:
        row = s.scalars(select(Submission)).one()
    assert row.verdict == "crashed"
    assert "SIGSEGV during check case-segv" in row.message, row.message
    assert row.failing_cases[0]["case"] == "case-segv"


def test_importing_the_scorer_is_start_up_not_a_hung_case(db, monkeypatch):
    """The scorer's import takes twice the case deadline: it is start-up (allowed
    startup_timeout_s), so the job is scored, not killed for no progress."""
    monkeypatch.setenv("FA_TEST_SCORER_IMPORT_S", "4")
    _add(db, "ok")
    work(db.engine, _config(case_timeout_s=2.0, startup_timeout_s=120.0), once=True)
    with db.sessions() as s:
        row = s.scalars(select(Submission)).one()
    assert (row.verdict, row.score) == ("scored", 1.5), row.message


def test_job_deadline(db):
    _add(db, "hang")
    work(db.engine, _config(case_timeout_s=60.0, job_timeout_s=4.0), once=True)
    with db.sessions() as s:
        row = s.scalars(select(Submission)).one()
    assert row.verdict == "timeout" and "job limit of 4 s" in row.message


def test_once_takes_one_job_and_secret_not_stored(db):
    a, b = _add(db, "ok"), _add(db, "ok")
    assert work(db.engine, _config(secret=987654321), once=True) == 1
    with db.sessions() as s:
        rows = {r.id: r for r in s.scalars(select(Submission))}
        assert rows[a].status == "done" and rows[b].status == "queued"
        stored = json.dumps([rows[a].detail, rows[a].message, rows[a].failing_cases])
    # The fake echoes the secret into its detail on purpose; the real scorer does not.
    # What the worker itself adds (config, elapsed time) must not hold it.
    assert "elapsed_s" in rows[a].detail
    assert stored.count("987654321") == 1
    # The settings it was scored under are stored with the score (the board compares them).
    assert rows[a].detail["settings"] == {"baseline": "sdpa_flash"}


def test_requeued_job_is_taken_again(db):
    sid = _add(db, "ok")
    job = claim(db.engine, "dead")  # a worker that died right after claiming, long ago
    assert job.id == sid
    with db.session() as s:
        s.get(Submission, sid).heartbeat_at = utcnow() - timedelta(hours=1)
    work(db.engine, _config(lease_s=600.0), drain=True)
    with db.sessions() as s:
        row = s.get(Submission, sid)
    assert (row.status, row.verdict, row.attempts) == ("done", "scored", 2)


def test_a_host_without_a_usable_gpu_refuses_to_start(tmp_path, capfd):
    """`fa-harness worker` with the real scorer on a host where CUDA runs nothing: one line,
    exit 4, and the queue left as it was (no job claimed, none blamed)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a usable GPU")
    from harness.cli import main
    from harness.cli.cmd_worker import EXIT_HOST_UNFIT

    path = tmp_path / "q.sqlite"
    d = open_db(str(path))
    sid = _add(d, "ok")
    rc = main(["worker", "--db", str(path), "--drain"])
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == EXIT_HOST_UNFIT == 4
    assert any(line.startswith("fa-harness worker: error: this host cannot score: no usable "
                               "CUDA GPU") for line in err), err
    assert not any("Traceback" in line for line in err)
    with d.sessions() as s:
        row = s.get(Submission, sid)
    d.close()
    assert (row.status, row.attempts, row.verdict) == ("queued", 0, None)


def test_a_job_the_host_could_not_score_goes_back_to_the_queue(db):
    """No verdict against the submitter: re-queued; the worker stops after two such jobs
    in a row (HostUnfit); an infrastructure error only once a second worker failed it."""
    from harness.submissions.worker import HostUnfit

    a, b = _add(db, "nogpu"), _add(db, "nogpu")
    logs: list[str] = []
    with pytest.raises(HostUnfit, match="2 jobs in a row"):
        work(db.engine, _config(name="hostA:1:gpu3"), drain=True, log=logs.append)
    with db.sessions() as s:
        rows = [s.get(Submission, i) for i in (a, b)]
    assert [(r.status, r.verdict, r.attempts) for r in rows] == [("queued", None, 1)] * 2
    assert all("could not score it" in r.message for r in rows)
    # The same place, restarted, passes them over; another worker fails them too.
    assert work(db.engine, _config(name="hostA:2:gpu3"), drain=True) == 0
    work(db.engine, _config(name="hostB:3:gpu3", host_fault_streak=5), drain=True)
    with db.sessions() as s:
        rows = [s.get(Submission, i) for i in (a, b)]
    assert [(r.status, r.verdict) for r in rows] == [("error", None)] * 2
    assert all(r.message.startswith("infrastructure error, not a verdict") for r in rows)


def test_a_scorer_that_cannot_start_is_the_hosts_fault(db):
    sid = _add(db, "ok")
    with pytest.raises(Exception, match="in a row"):
        work(db.engine, _config(scorer="tests.no_such_module:score", host_fault_streak=1),
             drain=True)
    with db.sessions() as s:
        row = s.get(Submission, sid)
    assert (row.status, row.verdict) == ("queued", None)
    assert "ModuleNotFoundError during start" in row.message


def test_a_result_waits_in_the_spool_until_the_database_takes_it(db, monkeypatch):
    """The database refuses the store three times (down): the worker waits with backoff,
    logs it in one line, and stores the result once; nothing stays in the spool."""
    from sqlalchemy.exc import OperationalError

    import harness.submissions.worker_store as ws

    real, calls = ws.finish, []

    def flaky(engine, job, outcome):
        calls.append(job.id)
        if len(calls) <= 3:
            raise OperationalError("UPDATE", {}, Exception("server closed the connection"))
        return real(engine, job, outcome)

    monkeypatch.setattr(ws, "finish", flaky)
    sid = _add(db, "ok")
    logs: list[str] = []
    assert work(db.engine, _config(), once=True, log=logs.append) == 1
    with db.sessions() as s:
        row = s.get(Submission, sid)
    assert (row.status, row.verdict, row.score) == ("done", "scored", 1.5)
    assert len(calls) == 4
    assert sum("database unreachable while storing" in m for m in logs) == 1
    assert any("database back after" in m for m in logs)
    assert list(ws.ResultSpool(db.engine.url.render_as_string(hide_password=True))
                .dir.iterdir()) == []


def test_a_spooled_result_of_a_dead_worker_is_stored_by_the_next_one(db):
    """A worker that died after its score was spooled but before it was stored: the next
    worker of this host stores it (once), rather than scoring the job again."""
    from harness.submissions.queue import Outcome
    from harness.submissions.worker_store import ResultSpool

    sid = _add(db, "ok")
    job = claim(db.engine, "elsewhere:1:gpu3")
    spool = ResultSpool(db.engine.url.render_as_string(hide_password=True))
    spool.put(job, Outcome("scored", "from the spool", score=2.5))
    assert work(db.engine, _config(), drain=True) == 0  # nothing left to score
    with db.sessions() as s:
        row = s.get(Submission, sid)
    assert (row.status, row.message, row.score, row.attempts) == (
        "done", "from the spool", 2.5, 1)
    assert spool.pending() == []


def test_a_claim_whose_commit_was_not_heard_of_is_put_back(db, monkeypatch):
    """The connection is cut just as the claim commits: the worker sees an error, waits,
    claims again; the claim it did not hear of goes back to the queue first (attempt not
    counted), so the job is scored now rather than after a lease."""
    from sqlalchemy.exc import OperationalError

    import harness.submissions.worker as worker

    real, calls = worker.claim, []

    def cut_once(engine, name):
        job = real(engine, name)
        calls.append(job)
        if len(calls) == 1:
            raise OperationalError("COMMIT", {}, Exception("server closed the connection"))
        return job

    monkeypatch.setattr(worker, "claim", cut_once)
    sid = _add(db, "ok")
    assert work(db.engine, _config(), drain=True) == 1
    with db.sessions() as s:
        row = s.get(Submission, sid)
    assert (row.status, row.verdict, row.attempts) == ("done", "scored", 1)


def test_the_lease_must_outlast_the_job_limit(tmp_path, capsys):
    from harness.cli import main

    rc = main(["worker", "--db", str(tmp_path / "q.sqlite"), "--job-timeout", "60",
               "--lease", "30"])
    assert rc == 2
    assert "--lease (30 s) must exceed --job-timeout (60 s)" in capsys.readouterr().err


def test_a_job_whose_claim_is_lost_is_stopped_and_not_stored(db):
    """The job's lease expired (its worker was cut off or frozen) and it was re-queued:
    the worker's next heartbeat finds the claim gone, stops the scoring child at once and
    stores nothing."""
    import threading

    from sqlalchemy import update

    with db.session() as s:
        row = Submission(name="slow", submitter="t", status="queued", source_hash="slow",
                         source=json.dumps({"mode.txt": "slow", "sleep.txt": "60"}))
        s.add(row)
        s.flush()
        sid = row.id
    logs: list[str] = []
    lost = threading.Event()

    def log(m: str) -> None:
        logs.append(m)
        if "abandoned, nothing of this attempt stored" in m:
            lost.set()

    t0 = time.monotonic()
    th = threading.Thread(target=work, args=(db.engine, _config(heartbeat_s=0.2,
                                                              case_timeout_s=90.0)),
                          kwargs={"should_stop": lost.is_set, "log": log})
    th.start()
    deadline = time.monotonic() + 60
    while not any("scoring, attempt 1" in m for m in logs):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with db.session() as s:  # what another worker's requeue_stale does at lease expiry
        s.execute(update(Submission).where(Submission.id == sid).values(
            status="queued", worker=None, claim_token=None, heartbeat_at=None))
    th.join(120)
    assert not th.is_alive() and time.monotonic() - t0 < 30, "the child was not stopped"
    assert lost.is_set(), logs
    with db.sessions() as s:
        row = s.get(Submission, sid)
    assert (row.status, row.verdict, row.finished_at) == ("queued", None, None)
