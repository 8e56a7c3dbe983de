"""What keeps a worker's results and liveness through database outages.

- `retrying` runs a database operation until it succeeds, waiting with exponential
  backoff between tries and saying so in one log line (not a traceback), for as long as
  the worker is not told to stop: a worker outlives a database that drops its connections
  or is gone for a while, idle or mid-job.
- `ResultSpool` keeps every finished score on local disk until the database has it: the
  worker writes the file before its first try to store, and removes it only once the
  database answered (stored, or the claim lost). A worker killed in between finds the file
  at its next start, and so does any worker of this host and database; storing is
  idempotent by the claim's token (harness.submissions.queue.finish), so a result is
  stored once however often it is tried.

A running job's lease and its heartbeats are harness.submissions.lease.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from harness.records.db.database import DatabaseUnavailable
from harness.records.paths import spool_dir
from harness.submissions.queue import Job, Outcome, finish

# What a database that is down, restarting or unreachable raises (and a SQLite file
# locked for longer than its busy timeout): worth waiting for, never a verdict.
DB_DOWN = (OperationalError, InterfaceError, DisconnectionError, PoolTimeout,
           DatabaseUnavailable)
T = TypeVar("T")
Log = Callable[[str], None]


def first_line(e: BaseException) -> str:
    """An exception in one line (a driver's error carries the SQL and a link after it)."""
    orig = getattr(e, "orig", None) or e
    text = (str(orig).strip().splitlines() or [""])[0][:300]
    return f"{type(orig).__name__}: {text}" if text else type(orig).__name__


class Backoff:
    """Waits that double from `first_s` up to `cap_s`, cut short when told to stop."""

    def __init__(self, first_s: float = 0.5, cap_s: float = 30.0) -> None:
        self.first_s, self.cap_s, self.next_s = first_s, cap_s, first_s

    def reset(self) -> None:
        self.next_s = self.first_s

    def wait(self, should_stop: Callable[[], bool]) -> None:
        end = time.monotonic() + self.next_s
        self.next_s = min(self.cap_s, self.next_s * 2)
        while time.monotonic() < end and not should_stop():
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))


def retrying(op: Callable[[], T], *, what: str, log: Log,
             should_stop: Callable[[], bool], backoff: Backoff | None = None) -> T | None:
    """`op()` once it succeeds; None when told to stop first. Database errors of DB_DOWN
    are waited out (one log line when it fails, one when it is back); others propagate."""
    backoff = backoff or Backoff()
    down_since: float | None = None
    while True:
        try:
            out = op()
        except DB_DOWN as e:
            if down_since is None:
                down_since = time.monotonic()
                log(f"database unreachable while {what} ({first_line(e)}); retrying")
            if should_stop():
                return None
            backoff.wait(should_stop)
            continue
        if down_since is not None:
            log(f"database back after {time.monotonic() - down_since:.1f} s ({what})")
        return out


def _job_doc(job: Job) -> dict[str, Any]:
    d = asdict(job)
    d["claimed_at"] = job.claimed_at.isoformat()
    d["files"] = {}  # the source is the database's; the result does not need it
    d["host_faults"] = list(job.host_faults)
    return d


def _job_of(d: dict[str, Any]) -> Job:
    d = dict(d)
    d["claimed_at"] = datetime.fromisoformat(d["claimed_at"])
    d["host_faults"] = tuple(d.get("host_faults") or ())
    return Job(**d)


class ResultSpool:
    """Finished scores waiting for their database: one JSON file per claim, mode 0600, in
    a folder of this database (`spool_dir()/worker-results/<hash of its URL>`)."""

    def __init__(self, target: str, directory: Path | None = None) -> None:
        key = hashlib.sha256(target.encode()).hexdigest()[:16]
        self.dir = directory or spool_dir() / "worker-results" / key
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def put(self, job: Job, outcome: Outcome) -> Path:
        path = self.dir / f"{job.id}-{job.token or job.attempts}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"job": _job_doc(job), "outcome": outcome.to_dict()}, f, default=str)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)  # atomic: a reader never sees half a result
        return path

    def pending(self) -> list[tuple[Path, Job, Outcome]]:
        out = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                d = json.loads(path.read_text())
                out.append((path, _job_of(d["job"]), Outcome.from_dict(d["outcome"])))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being written or removed by another worker of this host
        return out

    @staticmethod
    def drop(path: Path) -> None:
        with contextlib.suppress(OSError):
            path.unlink()


def store(engine: Any, spool: ResultSpool, job: Job, outcome: Outcome, *, log: Log,
          should_stop: Callable[[], bool], grace_s: float = 30.0) -> bool | None:
    """Spool the outcome, then store it until the database answers: True stored, False
    the claim was lost (not stored), None still waiting in the spool (told to stop and the
    database gone for `grace_s` more: the next start of a worker here stores it)."""
    path = spool.put(job, outcome)
    stop_at: list[float] = []

    def give_up() -> bool:
        if not should_stop():
            return False
        if not stop_at:
            stop_at.append(time.monotonic() + grace_s)
        return time.monotonic() > stop_at[0]

    stored = retrying(lambda: finish(engine, job, outcome),
                      what=f"storing the result of submission {job.id}", log=log,
                      should_stop=give_up)
    if stored is not None:
        spool.drop(path)
    return stored


def flush(engine: Any, spool: ResultSpool, log: Log) -> int:
    """Store what earlier lives of the workers of this host left in the spool (one try
    each; DB_DOWN propagates to the caller's retry). Returns how many were stored."""
    n = 0
    for path, job, outcome in spool.pending():
        stored = finish(engine, job, outcome)
        spool.drop(path)
        n += stored
        log(f"submission {job.id}: spooled result of attempt {job.attempts} "
            + ("stored" if stored else "not stored (claim lost)"))
    return n
