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

`finish` writes a verdict only while the row is still this worker's claim (same worker,
same attempt): a worker that was presumed dead and comes back cannot overwrite the result
of the attempt that replaced it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, select, update

from harness.records.db.engine import session_factory
from harness.records.db.models import Submission, utcnow

QUEUED, RUNNING, DONE, ERROR = "queued", "running", "done", "error"


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

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "message": self.message, "score": self.score,
                "failing_cases": self.failing_cases, "detail": self.detail,
                "status": self.status}


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
    """Store the outcome of `job`; False when the claim was lost (requeued meanwhile)."""
    with session_factory(engine)() as s, s.begin():
        res = s.execute(
            update(Submission)
            .where(Submission.id == job.id, Submission.status == RUNNING,
                   Submission.worker == job.worker, Submission.attempts == job.attempts)
            .values(status=outcome.status, verdict=outcome.verdict, score=outcome.score,
                    message=outcome.message, failing_cases=outcome.failing_cases or None,
                    detail=outcome.detail or None, finished_at=utcnow())
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
    return report


def queue_depth(engine: Engine) -> dict[str, int]:
    """Number of submissions per status."""
    from sqlalchemy import func

    with session_factory(engine)() as s:
        rows = s.execute(select(Submission.status, func.count()).group_by(Submission.status))
        return {status: int(n) for status, n in rows}
