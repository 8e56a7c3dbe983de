"""The submission queue: claiming jobs, finishing them, re-queueing abandoned ones.

The queue is the `submissions` table itself: `status` goes queued -> running -> done (or
error). No job is ever claimed twice:
- PostgreSQL: the claimer selects the oldest queued row `FOR UPDATE SKIP LOCKED`, so a
  concurrent claimer skips the locked row and takes the next one instead of waiting.
- SQLite: every write transaction of a `harness.records.db.make_engine` engine starts with
  BEGIN IMMEDIATE, so the select-then-update of one claimer holds the database write lock
  from the select on; the next claimer's select runs only after the first has committed and
  no longer sees the row as queued.

A worker that dies mid-job leaves its row `running`. `requeue_stale` puts rows whose claim
is older than the lease back in the queue, and gives up (status error, verdict crashed)
once a job has been tried `max_attempts` times, so a submission that kills its worker
cannot loop forever. The lease must exceed the worker's own job time limit (a live worker
kills its child before then), which is why claims need no heartbeat.

A worker killed mid-job (SIGKILL, OOM, a lost host) is found sooner than the lease when
possible: on PostgreSQL every worker holds a session advisory lock on its name
(`hold_liveness`) for as long as it lives, and `requeue_dead` re-queues the running jobs
of workers whose lock is free (the server drops it with the dead session); on SQLite, a
single-host queue, a worker of this host whose pid is gone is dead.

`finish` writes a verdict only while the row is still this worker's claim (same worker,
same attempt): a worker that was presumed dead and comes back cannot overwrite the result
of the attempt that replaced it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, select, update

from harness.records.db.engine import session_factory
from harness.records.db.models import Submission, SubmissionPass, utcnow

QUEUED, RUNNING, DONE, ERROR = "queued", "running", "done", "error"
# The pass name of a submission's backward entry (as results name their passes).
BWD = "bwd"


@dataclass(frozen=True)
class Job:
    """A claimed submission, as the worker needs it."""

    id: int
    name: str
    files: dict[str, str]
    manifest: dict[str, Any] | None
    source_hash: str
    worker: str
    attempts: int
    claimed_at: datetime


@dataclass
class Outcome:
    """What scoring reports and the worker writes back for a job (also scoring.ScoreReport)."""

    verdict: str
    message: str
    score: float | None = None
    failing_cases: list[dict[str, Any]] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)
    # "error": the runner, not the submission, could not score it (no GPU, no baseline).
    status: str = DONE
    # The backward's own outcome, when the submission declares one (its `status` unused):
    # stored as its own entry, so nothing of it can change the forward's verdict or score.
    backward: Outcome | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"verdict": self.verdict, "message": self.message, "score": self.score,
             "failing_cases": self.failing_cases, "detail": self.detail,
             "status": self.status}
        if self.backward is not None:
            d["backward"] = self.backward.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Outcome:
        """What `to_dict` wrote (the scoring child's result file); KeyError or TypeError
        when it is not that."""
        bwd = d.get("backward")
        return cls(verdict=str(d["verdict"]), message=str(d.get("message") or ""),
                   score=d.get("score"), failing_cases=list(d.get("failing_cases") or []),
                   detail=dict(d.get("detail") or {}), status=str(d.get("status") or DONE),
                   backward=cls.from_dict(bwd) if isinstance(bwd, dict) else None)


def claim(engine: Engine, worker: str) -> Job | None:
    """Claim the oldest queued submission for `worker`, or None when the queue is empty."""
    with session_factory(engine)() as s, s.begin():
        q = (select(Submission).where(Submission.status == QUEUED)
             .order_by(Submission.created_at, Submission.id).limit(1))
        if engine.dialect.name == "postgresql":
            q = q.with_for_update(skip_locked=True)
        row = s.scalars(q).first()
        if row is None:
            return None
        now = utcnow()
        row.status = RUNNING
        row.worker = worker
        row.claimed_at = now
        row.attempts = (row.attempts or 0) + 1
        s.flush()
        return Job(id=row.id, name=row.name, files=json.loads(row.source or "{}"),
                   manifest=row.manifest, source_hash=row.source_hash, worker=worker,
                   attempts=row.attempts, claimed_at=now)


def finish(engine: Engine, job: Job, outcome: Outcome) -> bool:
    """Store the outcome of `job`, and its backward's as the submission's "bwd" entry, in
    one transaction; False when the claim was lost (requeued meanwhile)."""
    now = utcnow()
    with session_factory(engine)() as s, s.begin():
        res = s.execute(
            update(Submission)
            .where(Submission.id == job.id, Submission.status == RUNNING,
                   Submission.worker == job.worker, Submission.attempts == job.attempts)
            .values(status=outcome.status, verdict=outcome.verdict, score=outcome.score,
                    message=outcome.message, failing_cases=outcome.failing_cases or None,
                    detail=outcome.detail or None, finished_at=now)
            .execution_options(synchronize_session=False)
        )
        if res.rowcount != 1:
            return False
        # An earlier attempt's entry (a job scored again) is replaced, never kept beside.
        s.execute(delete(SubmissionPass).where(SubmissionPass.submission_id == job.id))
        b = outcome.backward
        if b is not None:
            s.add(SubmissionPass(submission_id=job.id, pass_name=BWD, verdict=b.verdict,
                                 score=b.score, message=b.message,
                                 failing_cases=b.failing_cases or None,
                                 detail=b.detail or None, finished_at=now))
        return True


def release(engine: Engine, job: Job, message: str) -> bool:
    """Put a claimed job back in the queue (its score was not usable: the GPU was shared).
    The attempt still counts towards `max_attempts`. False when the claim was lost."""
    with session_factory(engine)() as s, s.begin():
        res = s.execute(
            update(Submission)
            .where(Submission.id == job.id, Submission.status == RUNNING,
                   Submission.worker == job.worker, Submission.attempts == job.attempts)
            .values(status=QUEUED, worker=None, claimed_at=None, message=message)
            .execution_options(synchronize_session=False)
        )
        return res.rowcount == 1


@dataclass
class RequeueReport:
    requeued: list[int] = field(default_factory=list)
    abandoned: list[int] = field(default_factory=list)


def requeue_stale(engine: Engine, *, lease_s: float, max_attempts: int,
                  now: datetime | None = None) -> RequeueReport:
    """Re-queue running jobs claimed more than `lease_s` ago; abandon those already tried
    `max_attempts` times."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=lease_s)
    report = RequeueReport()
    with session_factory(engine)() as s, s.begin():
        q = select(Submission).where(Submission.status == RUNNING,
                                     Submission.claimed_at < cutoff)
        if engine.dialect.name == "postgresql":
            q = q.with_for_update(skip_locked=True)
        for row in s.scalars(q):
            _give_back(row, max_attempts, now, report)
    return report


def _give_back(row: Submission, max_attempts: int, now: datetime,
               report: RequeueReport) -> None:
    if (row.attempts or 0) >= max_attempts:
        row.status = ERROR
        row.verdict = "crashed"
        row.finished_at = now
        row.message = (f"abandoned after {row.attempts} attempt(s): the worker running "
                       f"it stopped without a verdict (last: {row.worker})")
        report.abandoned.append(row.id)
    else:
        row.status = QUEUED
        row.worker = None
        row.claimed_at = None
        report.requeued.append(row.id)


def liveness_key(worker: str) -> int:
    from harness.submissions.gpulock import advisory_key

    return advisory_key("worker", worker)


def hold_liveness(engine: Engine, worker: str) -> Any:
    """On PostgreSQL: a connection holding the advisory lock that says `worker` is alive
    (close it to give it up). None on other databases."""
    if engine.dialect.name != "postgresql":
        return None
    from sqlalchemy import text

    conn = engine.connect()
    conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": liveness_key(worker)})
    conn.commit()
    return conn


def _dead(s: Any, dialect: str, worker: str, me: str) -> bool:
    if worker == me:
        return False
    if dialect == "postgresql":
        from sqlalchemy import text

        # Free lock: its session is gone, so is the worker. (The transaction-level lock
        # taken to find out goes with this transaction.)
        k = liveness_key(worker)
        return bool(s.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": k}).scalar())
    import os
    import socket

    host, _, rest = worker.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another host's worker: only its lease can tell
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def requeue_dead(engine: Engine, *, me: str, max_attempts: int) -> RequeueReport:
    """Re-queue running jobs whose worker is known dead (see the module docstring)."""
    report = RequeueReport()
    now = utcnow()
    with session_factory(engine)() as s, s.begin():
        q = select(Submission).where(Submission.status == RUNNING)
        if engine.dialect.name == "postgresql":
            q = q.with_for_update(skip_locked=True)
        verdicts: dict[str, bool] = {}
        for row in s.scalars(q).all():
            w = row.worker or ""
            if w not in verdicts:
                verdicts[w] = bool(w) and _dead(s, engine.dialect.name, w, me)
            if verdicts[w]:
                _give_back(row, max_attempts, now, report)
    return report


def queue_depth(engine: Engine) -> dict[str, int]:
    """Number of submissions per status."""
    from sqlalchemy import func

    with session_factory(engine)() as s:
        rows = s.execute(select(Submission.status, func.count()).group_by(Submission.status))
        return {status: int(n) for status, n in rows}
