"""The worker fault drill: real `fa-harness worker` processes on PostgreSQL, reached
through a TCP proxy that drops every connection again and again and twice refuses all
of them for seconds (the database gone: once mid-job, once while the workers are idle),
plus a worker killed with SIGKILL mid-job (a replacement started, as a supervisor
would) and one stopped with SIGSTOP for longer than the lease. The scorer is a CPU stub
(tests/drill_helpers.py); the workers, their scoring children, the queue and the
database are real.

Held: no result lost (every job ends scored), none stored twice, no job scored twice, no
traceback in any worker's stderr, and every surviving worker stops cleanly. *Scored*: the
stub scorer ran through all its cases to its score (it notes each such run in a file,
stored or not; drill_helpers.drill_scorer); a job noted twice was scored twice, device
time spent twice. The frozen worker's scoring child is not frozen with it (it runs in its
own process group): it must not score on while its worker cannot watch it, and the
worker, resumed past its lease, must abandon the job, not finish it. Run with `-s` to see
the figures line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from drill_helpers import Proxy
from sqlalchemy import select
from sqlalchemy.engine import make_url

from harness.records.db import open_db
from harness.records.db.models import Submission, SubmissionPass

ROOT = Path(__file__).resolve().parents[1]
SCORER = "tests.drill_helpers:drill_scorer"
N_JOBS, LATE_JOBS = 12, 2
# The stub scores in 0.5 s, but its child starts torch first: 6-9 s a job on 2 busy cores.
JOB_TIMEOUT_S, LEASE_S = 20, 24


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


def _running(events: Path, pid: int) -> int | None:
    """The job the worker of `pid` is scoring now (claimed, not finished), or None."""
    current = None
    for e in _events(events):
        if f":{pid}:" not in str(e.get("worker")):
            continue
        if e["event"] == "claim":
            current = e["id"]
        elif e["event"] in ("finish", "release", "host_fault", "abandon"):
            current = None
    return current


def _wait(what: str, cond, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, f"drill: timed out waiting for {what}"
        time.sleep(0.2)


def _add(db, tags: range) -> list[int]:
    with db.session() as s:
        rows = [Submission(name=f"d{t}", submitter="drill", status="queued",
                           source=json.dumps({"mode.txt": "drill", "tag.txt": str(t),
                                              "sleep.txt": "0.5"}),
                           source_hash=str(t)) for t in tags]
        s.add_all(rows)
        s.flush()
        return [r.id for r in rows]


def _all_done(db, n: int) -> bool:
    with db.sessions() as s:
        rows = s.scalars(select(Submission.status)).all()
    return len(rows) == n and all(st in ("done", "error") for st in rows)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fault_drill(pg_url, tmp_path):
    db = open_db(pg_url)
    ids = _add(db, range(N_JOBS))
    u = make_url(pg_url)
    proxy = Proxy((u.host or "127.0.0.1", u.port or 5432))
    url = u.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    events, scored = tmp_path / "events.jsonl", tmp_path / "scored.txt"
    env = {k: v for k, v in os.environ.items() if k != "FA_HARNESS_SECRET"}
    env.update(PYTHONPATH=str(ROOT), FA_DRILL_SCORED=str(scored))
    gpus = [f"GPU-{uuid.uuid4()}" for _ in range(3)]
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, gpu: str) -> subprocess.Popen:
        err = open(tmp_path / f"{name}.err", "wb")  # noqa: SIM115 - the worker's stderr
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "harness", "worker", "--db", url, "--gpu", gpu,
             "--scorer", SCORER, "--job-timeout", str(JOB_TIMEOUT_S), "--lease", str(LEASE_S),
             "--heartbeat", "1", "--case-timeout", str(JOB_TIMEOUT_S),
             "--memory-limit-mb", "2000", "--events", str(events)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        return procs[name]

    t0 = time.monotonic()
    drops = 0
    try:
        for name, gpu in zip(("w1", "w2", "w3"), gpus, strict=True):
            start(name, gpu)
        # SIGKILL mid-job; its replacement on the same GPU, as a supervisor would start it.
        w1 = procs["w1"]
        _wait("w1's first job", lambda: _running(events, w1.pid), 120)
        proxy.drop()
        drops += 1
        time.sleep(0.5)
        killed_job = _running(events, w1.pid)
        os.kill(w1.pid, signal.SIGKILL)
        w1.wait(10)
        start("w4", gpus[0])
        # SIGSTOP mid-job, for longer than the lease.
        w2 = procs["w2"]
        _wait("w2's job", lambda: _running(events, w2.pid), 60)
        time.sleep(0.5)
        stopped_job = _running(events, w2.pid)
        os.kill(w2.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        for _ in range(4):  # connections dropped while jobs run
            time.sleep(1.5)
            drops += 1
            proxy.drop()
        proxy.outage(5.0)  # the database gone mid-job
        for _ in range(4):
            time.sleep(1.5)
            drops += 1
            proxy.drop()
        time.sleep(max(0.0, stopped_at + LEASE_S + 4 - time.monotonic()))
        os.kill(w2.pid, signal.SIGCONT)
        _wait("every job finished", lambda: _all_done(db, N_JOBS), 120)
        proxy.outage(8.0)  # the database gone while the workers are idle
        ids += _add(db, range(N_JOBS, N_JOBS + LATE_JOBS))
        _wait("the jobs queued after the idle outage", lambda: _all_done(db, len(ids)), 90)
        for name in ("w2", "w3", "w4"):
            procs[name].send_signal(signal.SIGTERM)
        codes = {name: procs[name].wait(60) for name in ("w2", "w3", "w4")}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
        proxy.close()
    elapsed = time.monotonic() - t0

    with db.sessions() as s:
        rows = {r.id: r for r in s.scalars(select(Submission))}
        passes = s.scalars(select(SubmissionPass)).all()
    db.close()
    ev = _events(events)
    stored = Counter(e["id"] for e in ev if e["event"] == "finish" and e.get("stored"))
    claims = Counter(e["id"] for e in ev if e["event"] == "claim")
    runs = Counter(line.split()[0] for line in scored.read_text().splitlines())
    tag = {sid: rows[sid].source_hash for sid in rows}
    lost = [sid for sid in ids if (rows[sid].status, rows[sid].verdict) != ("done", "scored")]
    stored_twice = [sid for sid, n in stored.items() if n > 1]
    not_stored = [sid for sid in ids if stored[sid] != 1]
    scored_twice = [sid for sid in ids if runs[tag[sid]] > 1]
    abandoned = [e["id"] for e in ev if e["event"] == "abandon"]
    reruns = [sid for sid, n in claims.items() if n > 1]
    errs = {p.name: p.read_text(errors="replace") for p in tmp_path.glob("w*.err")}
    tracebacks = [n for n, text in errs.items() if "Traceback" in text]
    felt = sum(text.count("database unreachable") for text in errs.values())
    print(f"\nfault drill: {len(ids)} jobs, 4 workers (3 + 1 replacement), {drops} drops "
          f"({proxy.dropped} connections cut), 2 outages (5 s mid-job, 8 s idle; "
          f"{proxy.refused} connections refused), 1 SIGKILL, 1 SIGSTOP past the "
          f"{LEASE_S} s lease; lost {len(lost)}, stored twice {len(stored_twice)}, scored "
          f"twice {len(scored_twice)} {scored_twice}, abandoned {abandoned} (frozen job "
          f"{stopped_job}), re-claimed {len(reruns)} (killed job {killed_job}, "
          f"frozen job {stopped_job}, others {sorted(set(reruns) - {killed_job, stopped_job})})"
          f", database-unreachable log lines {felt}, tracebacks {len(tracebacks)}, "
          f"{elapsed:.0f} s")
    assert not lost, {sid: (rows[sid].status, rows[sid].verdict, rows[sid].message)
                      for sid in lost}
    assert not stored_twice and not not_stored, (stored_twice, not_stored)
    assert not scored_twice, {sid: [ln for ln in scored.read_text().splitlines()
                                    if ln.split()[0] == tag[sid]] for sid in scored_twice}
    # The frozen worker came back past its lease and abandoned its job: no verdict, no
    # host fault, nothing stored; another worker scored it, once.
    assert abandoned == [stopped_job], (abandoned, stopped_job)
    assert runs[tag[stopped_job]] == 1
    assert not passes
    assert not tracebacks, {n: errs[n][-3000:] for n in tracebacks}
    assert codes == {"w2": 0, "w3": 0, "w4": 0}, codes
    assert felt > 0, "the outages were not felt by any worker"
    # The killed worker's job was taken again, by another worker, after its lease.
    assert claims[killed_job] >= 2 and rows[killed_job].attempts >= 2
    # Each stored result is the claim the row now names.
    for sid in ids:
        fin = [e for e in ev if e["event"] == "finish" and e.get("stored") and e["id"] == sid]
        assert (fin[0]["worker"], fin[0]["attempt"]) == (rows[sid].worker, rows[sid].attempts)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_queue_whose_tables_are_dropped_ends_the_worker_in_one_line(pg_url, tmp_path):
    """Not an outage but the queue itself gone (its schema dropped under an idle worker):
    the worker stops with one line and exit 1, never a traceback."""
    from sqlalchemy import text

    from harness.records.db.engine import make_engine

    open_db(pg_url).close()
    schema = str(make_url(pg_url).query["options"]).split("=", 1)[1]
    err = tmp_path / "w.err"
    env = {k: v for k, v in os.environ.items() if k != "FA_HARNESS_SECRET"}
    env["PYTHONPATH"] = str(ROOT)
    with open(err, "wb") as f:
        p = subprocess.Popen([sys.executable, "-m", "harness", "worker", "--db", pg_url,
                              "--gpu", f"GPU-{uuid.uuid4()}", "--scorer", SCORER],
                             cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=f)
    try:
        _wait("the worker to start", lambda: ": database " in err.read_text(), 60)
        time.sleep(1.0)
        admin = make_engine(pg_url.split("?")[0])
        with admin.begin() as c:  # dropped, then empty again (the fixture drops it after)
            c.execute(text(f"DROP SCHEMA {schema} CASCADE"))
            c.execute(text(f"CREATE SCHEMA {schema}"))
        admin.dispose()
        rc = p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    text_err = err.read_text()
    assert rc == 1, text_err
    assert "Traceback" not in text_err, text_err
    assert "fa-harness worker: error: the queue database failed: " in text_err
