"""The submission queue: claiming jobs, finishing them, re-queueing abandoned ones.

The queue is the `submissions` table itself: `status` goes queued -> running -> done (or
error). No job is ever claimed twice:
- PostgreSQL: the claimer selects the oldest queued row `FOR UPDATE SKIP LOCKED`, so a
  concurrent claimer skips the locked row and takes the next one instead of waiting.
- SQLite: every write transaction of a `harness.records.db.make_engine` engine starts with
  BEGIN IMMEDIATE, so the select-then-update of one claimer holds the database write lock
  from the select on; the next claimer's select runs only after the first has committed and
  no longer sees the row as queued.

Liveness is a lease on the row, measured on the database's clock only (PostgreSQL's
now(); SQLite is one host's file): a claim sets `claimed_at` and `heartbeat_at`, the
worker renews `heartbeat_at` while the job runs (`heartbeat`), and `requeue_stale` puts
back a running row whose last heartbeat is older than the lease. A connection the
database dropped costs a worker nothing (it reconnects and beats again), and hosts whose
clocks disagree cannot expire each other's leases. The lease must exceed the worker's
own job time limit (a live worker kills its child before then), so a worker cut off from
the database for a while keeps its job. A lease that expired is never renewed, even
while no other worker has taken the job yet: its worker was out of touch for the whole
lease and abandons the job (harness.submissions.lease). A dead worker's job waits for its lease; on
SQLite, a single-host queue, a worker of this host whose pid is gone is dead at once
(`requeue_dead`). A job given back more than `max_attempts` times for its worker's death
is abandoned (status error, verdict crashed), so a submission that kills its worker
cannot loop forever.

Every claim carries a random token. `finish` stores a verdict only while the row is
still that claim, and is idempotent: a retry after a lost commit acknowledgement finds
its own result stored and says so, and a worker that was presumed dead and comes back
cannot overwrite the result of the attempt that replaced it.

A job the host could not score (no usable GPU, a driver fault, a scoring child that died
before it ran anything of the submission) is no verdict on the submission:
`requeue_host_fault` puts it back, remembers where it failed, and only when it has
failed on `limit` different workers (host and GPU) is it stored as an infrastructure
error (status error, no verdict). Claims pass over jobs that already failed where the
claimer runs.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, and_, delete, func, or_, select, update
from sqlalchemy.orm import Session

from harness.records.db.engine import session_factory
from harness.records.db.models import Submission, SubmissionPass, utcnow

QUEUED, RUNNING, DONE, ERROR = "queued", "running", "done", "error"
# The pass name of a submission's backward entry (as results name their passes).
BWD = "bwd"
# What `requeue_host_fault` did with a job.
REQUEUED, HOST_ERROR, LOST = "requeued", "infrastructure error", "claim lost"
# A claimer passes over jobs that already failed on its host and GPU: it looks this far.
_CLAIM_WINDOW = 16


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
    token: str = ""  # the claim's own token ("" for jobs made by hand: worker + attempts)
    host_faults: tuple[dict[str, Any], ...] = ()  # earlier attempts the host could not score


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


def db_now(s: Session) -> datetime:
    """The database's clock: PostgreSQL's now() (this transaction's start), so that every
    worker measures leases on one clock whatever its host's says; a SQLite file's is its
    host's."""
    if s.get_bind().dialect.name == "postgresql":
        return s.execute(select(func.now())).scalar_one().astimezone(UTC)
    return utcnow()


def place_of(worker: str) -> str:
    """Where a worker runs, its pid left out ("host:pid:gpuN" -> "host:gpuN"): a worker
    restarted on the same host and GPU is the same place."""
    parts = worker.split(":")
    if len(parts) >= 3 and parts[1].isdigit():
        return ":".join([parts[0], *parts[2:]])
    return worker


def _faults(row: Submission) -> list[dict[str, Any]]:
    got = (row.detail or {}).get("host_faults") if row.status == QUEUED else None
    return [f for f in got if isinstance(f, dict)] if isinstance(got, list) else []


def claim(engine: Engine, worker: str) -> Job | None:
    """Claim the oldest queued submission for `worker` that has not already failed where
    `worker` runs (see `requeue_host_fault`), or None when there is none."""
    here = place_of(worker)
    with session_factory(engine)() as s, s.begin():
        base = (select(Submission).where(Submission.status == QUEUED)
                .order_by(Submission.created_at, Submission.id))
        pg = engine.dialect.name == "postgresql"
        row = None
        # One row first: a wider look locks rows a concurrent claimer would then skip.
        for n in (1, _CLAIM_WINDOW):
            q = base.limit(n).with_for_update(skip_locked=True) if pg else base.limit(n)
            rows = s.scalars(q).all()
            row = next((r for r in rows
                        if here not in {f.get("place") for f in _faults(r)}), None)
            if row is not None or len(rows) < n:
                break
        if row is None:
            return None
        now = db_now(s)
        faults = tuple(_faults(row))
        row.status = RUNNING
        row.worker = worker
        row.claimed_at = now
        row.heartbeat_at = now
        row.claim_token = secrets.token_hex(16)
        row.attempts = (row.attempts or 0) + 1
        s.flush()
        return Job(id=row.id, name=row.name, files=json.loads(row.source or "{}"),
                   manifest=row.manifest, source_hash=row.source_hash, worker=worker,
                   attempts=row.attempts, claimed_at=now, token=row.claim_token,
                   host_faults=faults)


def _claimed(job: Job) -> Any:
    """The condition that the row is still `job`'s claim."""
    mine = (Submission.claim_token == job.token if job.token else
            and_(Submission.worker == job.worker, Submission.attempts == job.attempts))
    return and_(Submission.id == job.id, Submission.status == RUNNING, mine)


def heartbeat(engine: Engine, job: Job, *, lease_s: float | None = None) -> bool:
    """Renew the lease of `job` with the database's clock; False when the claim is lost:
    the row is no longer this claim (re-queued, claimed again: another token) or, given
    `lease_s`, its lease had already expired (no renewal for `lease_s`), whoever holds it
    now. A lost lease is never renewed: its worker abandons the job."""
    with session_factory(engine)() as s, s.begin():
        now = db_now(s)
        cond = _claimed(job)
        if lease_s is not None:
            cutoff = now - timedelta(seconds=lease_s)
            hb = Submission.heartbeat_at
            cond = and_(cond, or_(hb >= cutoff,
                                  and_(hb.is_(None), Submission.claimed_at >= cutoff)))
        res = s.execute(update(Submission).where(cond).values(heartbeat_at=now)
                        .execution_options(synchronize_session=False))
        return res.rowcount == 1


def finish(engine: Engine, job: Job, outcome: Outcome) -> bool:
    """Store the outcome of `job`, and its backward's as the submission's "bwd" entry, in
    one transaction. True when stored, now or by an earlier call with the same outcome for
    the same claim (a retry whose first commit went through unacknowledged); False when
    the claim was lost (re-queued meanwhile) or already finished otherwise."""
    with session_factory(engine)() as s, s.begin():
        now = db_now(s)
        res = s.execute(
            update(Submission).where(_claimed(job))
            .values(status=outcome.status, verdict=outcome.verdict, score=outcome.score,
                    message=outcome.message, failing_cases=outcome.failing_cases or None,
                    detail=outcome.detail or None, finished_at=now)
            .execution_options(synchronize_session=False)
        )
        if res.rowcount != 1:
            if not job.token:
                return False
            # This claim's row already finished: by this very outcome (a retry), or not.
            got = s.execute(select(Submission.status, Submission.verdict, Submission.score,
                                   Submission.message).where(
                Submission.id == job.id, Submission.claim_token == job.token,
                Submission.status.in_((DONE, ERROR)))).first()
            return got is not None and tuple(got) == (outcome.status, outcome.verdict,
                                                      outcome.score, outcome.message)
        # An earlier attempt's entry (a job scored again) is replaced, never kept beside.
        s.execute(delete(SubmissionPass).where(SubmissionPass.submission_id == job.id))
        b = outcome.backward
        if b is not None:
            s.add(SubmissionPass(submission_id=job.id, pass_name=BWD, verdict=b.verdict,
                                 score=b.score, message=b.message,
                                 failing_cases=b.failing_cases or None,
                                 detail=b.detail or None, finished_at=now))
        return True


_UNCLAIMED = {"status": QUEUED, "worker": None, "claimed_at": None, "heartbeat_at": None,
              "claim_token": None}


def release(engine: Engine, job: Job, message: str) -> bool:
    """Put a claimed job back in the queue (its score was not usable: the GPU was shared).
    The attempt still counts towards `max_attempts`. False when the claim was lost."""
    with session_factory(engine)() as s, s.begin():
        res = s.execute(
            update(Submission).where(_claimed(job)).values(**_UNCLAIMED, message=message)
            .execution_options(synchronize_session=False)
        )
        return res.rowcount == 1


def requeue_host_fault(engine: Engine, job: Job, reason: str, *, limit: int) -> str:
    """The host could not score `job` (see the module docstring): put it back in the queue
    (REQUEUED), or, once it has failed on `limit` different workers, store it as an
    infrastructure error (HOST_ERROR); LOST when the claim was lost meanwhile."""
    with session_factory(engine)() as s, s.begin():
        q = select(Submission).where(_claimed(job))
        if engine.dialect.name == "postgresql":
            q = q.with_for_update()
        row = s.scalars(q).first()
        if row is None:
            return LOST
        now = db_now(s)
        faults = [*job.host_faults, {"worker": job.worker, "place": place_of(job.worker),
                                     "attempt": job.attempts, "at": now.isoformat(),
                                     "message": reason[:500]}]
        places = sorted({str(f.get("place")) for f in faults})
        row.detail = {"host_faults": faults}
        if len(places) >= limit:
            row.status, row.verdict, row.score, row.finished_at = ERROR, None, None, now
            row.claim_token = None
            row.message = (f"infrastructure error, not a verdict on the submission: "
                           f"{len(places)} workers could not score it ({', '.join(places)}); "
                           f"last: {reason[:300]}")
            return HOST_ERROR
        for k, v in _UNCLAIMED.items():
            setattr(row, k, v)
        row.message = f"re-queued: {job.worker} could not score it: {reason[:300]}"
        return REQUEUED


@dataclass
class RequeueReport:
    requeued: list[int] = field(default_factory=list)
    abandoned: list[int] = field(default_factory=list)


def requeue_stale(engine: Engine, *, lease_s: float, max_attempts: int,
                  now: datetime | None = None) -> RequeueReport:
    """Re-queue running jobs whose lease (`lease_s` from the last heartbeat, or from the
    claim for rows without one) has expired by the database's clock (or by `now`);
    abandon those already given back `max_attempts` times."""
    report = RequeueReport()
    with session_factory(engine)() as s, s.begin():
        now = now or db_now(s)
        cutoff = now - timedelta(seconds=lease_s)
        hb = Submission.heartbeat_at
        q = select(Submission).where(
            Submission.status == RUNNING,
            or_(hb < cutoff, and_(hb.is_(None), Submission.claimed_at < cutoff)))
        if engine.dialect.name == "postgresql":
            q = q.with_for_update(skip_locked=True)
        for row in s.scalars(q):
            _give_back(row, max_attempts, now, report)
    return report


def _give_back(row: Submission, max_attempts: int, now: datetime,
               report: RequeueReport) -> None:
    # Attempts the host could not score are not held against the submission.
    blamed = (row.attempts or 0) - len((row.detail or {}).get("host_faults") or [])
    if blamed >= max_attempts:
        row.status = ERROR
        row.verdict = "crashed"
        row.finished_at = now
        row.claim_token = None
        row.message = (f"abandoned after {row.attempts} attempt(s): the worker running "
                       f"it stopped without a verdict (last: {row.worker})")
        report.abandoned.append(row.id)
    else:
        for k, v in _UNCLAIMED.items():
            setattr(row, k, v)
        report.requeued.append(row.id)


def _dead_here(worker: str) -> bool:
    """A worker of this host whose pid is gone."""
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
    """SQLite (one host): re-queue running jobs of this host's workers whose process is
    gone. On a server database only the lease tells (pids of other hosts, or of other
    containers of this one, say nothing)."""
    report = RequeueReport()
    if engine.dialect.name != "sqlite":
        return report
    with session_factory(engine)() as s, s.begin():
        now = db_now(s)
        verdicts: dict[str, bool] = {}
        for row in s.scalars(select(Submission).where(Submission.status == RUNNING)).all():
            w = row.worker or ""
            if w not in verdicts:
                verdicts[w] = bool(w) and w != me and _dead_here(w)
            if verdicts[w]:
                _give_back(row, max_attempts, now, report)
    return report


def requeue_own(engine: Engine, me: str) -> list[int]:
    """Put back jobs claimed by `me` that `me` is not scoring: called between jobs, these
    are claims whose commit went through while the worker saw an error (a connection cut
    at the commit) and claimed again. Nothing of them ran: the attempt is not counted."""
    with session_factory(engine)() as s, s.begin():
        rows = s.scalars(select(Submission).where(Submission.status == RUNNING,
                                                  Submission.worker == me)).all()
        for row in rows:
            for k, v in _UNCLAIMED.items():
                setattr(row, k, v)
            row.attempts = max(0, (row.attempts or 0) - 1)
        return [r.id for r in rows]


def queue_depth(engine: Engine) -> dict[str, int]:
    """Number of submissions per status."""
    with session_factory(engine)() as s:
        rows = s.execute(select(Submission.status, func.count()).group_by(Submission.status))
        return {status: int(n) for status, n in rows}
