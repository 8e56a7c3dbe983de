"""The submission worker: claims queued submissions and scores each in a child process.

One worker per GPU (`fa-harness worker --gpu N`): the worker locks the GPU by its UUID
(harness.submissions.gpulock; a second worker on it is refused, or waits with
`wait_for_gpu`), and around every job asks NVML which other compute processes use the GPU:
it claims nothing while another process is there (up to `busy_wait_s`), and a job during
or after which one was seen is re-queued (`on_shared="requeue"`, while attempts remain)
or stored marked `detail.gpu_sharing.shared` with a message saying the score is not comparable.
For each claimed job the worker starts a fresh child process
(`python -m harness.submissions.worker --child JOB`) with `CUDA_VISIBLE_DEVICES=<GPU UUID>`,
in its own process group, killed with the worker if the worker dies, and watches it:
- a per-case deadline: the child reports each case it starts (a line in a progress file);
  no progress for `case_timeout_s` (a kernel looping or sleeping forever) -> the whole
  process group is killed, verdict `timeout` naming the case;
- a job deadline `job_timeout_s` for the whole scoring;
- a host memory limit: the child's resident set is read from /proc and the child killed
  above `memory_limit_mb` (RLIMIT_AS cannot be used: CUDA reserves huge virtual address
  ranges); the GPU memory is capped inside the child through torch's allocator fraction;
- a child that dies without a result (segfault, CUDA teardown abort) -> `crashed`, with
  the case it was on and the tail of its stderr.
Whatever a submission does, the worker writes a verdict and takes the next job: it
survives every bad submission. (Starting and watching one job's child is
harness.submissions.worker_run; the child itself harness.submissions.worker_child.)

Nothing of the host is ever a verdict on a submission, and no result is lost:
- `fa-harness worker` checks first that the host can score (`worker_run.preflight`: the
  GPU runs a kernel) and refuses to start otherwise; a job whose scoring the host failed
  (no usable GPU, a driver fault, a child dead before it ran anything) is re-queued with
  its fault remembered, stored as an infrastructure error only once it failed on
  `host_fault_workers` different workers, and a worker that failed `host_fault_streak`
  jobs in a row stops (HostUnfit) instead of draining the queue into errors;
- the running job's lease is renewed by heartbeats on the database's clock (see
  harness.submissions.queue); jobs of a dead worker are re-queued once their lease has
  expired;
- a worker scores only under its lease (harness.submissions.lease): its child asks it
  before every stage and case and before writing a result, and the worker checks again
  before storing. A worker that finds its lease lost (it expired: the worker was stopped
  or cut off; or another worker took the job) abandons the job at once: nothing more of
  it runs, nothing is stored, it is no verdict and no host fault, and a job still its own
  goes back to the queue;
- a database that drops its connections or is gone for a while is waited out with
  backoff, idle or mid-job, and every finished score goes to a local spool first and is
  stored, once, when the database is back (harness.submissions.worker_store).

The secret mixed into every case seed is worker configuration: `FA_HARNESS_SECRET` (an
integer) or, when unset, a random value per worker start. It is handed to the child in
the job file (mode 0600, in a private temporary folder) and never stored with results.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from harness.submissions.gpulock import GpuWatch, hold_back, lock_gpu
from harness.submissions.lease import Lease, clock
from harness.submissions.queue import (
    HOST_ERROR,
    Job,
    claim,
    queue_depth,
    release,
    requeue_dead,
    requeue_host_fault,
    requeue_own,
    requeue_stale,
)
from harness.submissions.ranking import settings_of
from harness.submissions.worker_child import child_main, probe_main
from harness.submissions.worker_run import WorkerConfig, host_fault, preflight, run_job
from harness.submissions.worker_store import (
    Backoff,
    ResultSpool,
    flush,
    retrying,
    store,
)

__all__ = ["HostUnfit", "WorkerConfig", "config_dict", "main", "preflight", "run_job",
           "work"]


class HostUnfit(RuntimeError):
    """This host failed `host_fault_streak` jobs in a row: it stops taking jobs."""


def _event(config: WorkerConfig, **fields: Any) -> None:
    if config.events:
        with open(config.events, "a") as f:
            f.write(json.dumps({"t": time.time(), "worker": config.name,
                                "gpu": config.gpu_uuid, **fields}) + "\n")


def work(engine: Any, config: WorkerConfig, *, once: bool = False, drain: bool = False,
         should_stop: Callable[[], bool] | None = None,
         log: Callable[[str], None] | None = None) -> int:
    """Lock the GPU, then claim and score jobs until stopped. `once`: at most one job.
    `drain`: stop when the queue is empty. Returns the number of jobs finished. Raises
    gpulock.GpuBusy when another worker holds the GPU, gpulock.GpuMissing for a GPU that
    is not there, HostUnfit when the host failed jobs in a row. A database that cannot
    be reached is waited for."""
    log = log or (lambda _m: None)
    should_stop = should_stop or (lambda: False)
    name = config.name or "worker"
    lock = None
    if config.gpu is not None:
        gpu = config.gpu
        lock = retrying(lambda: lock_gpu(engine, gpu, owner=name, wait=config.wait_for_gpu),
                        what="locking the GPU", log=log, should_stop=should_stop)
        if lock is None:
            return 0
        config.gpu_uuid = lock.uuid
        if lock.note:
            log(lock.note)
    why = preflight(config) if config.preflight else None
    if why is not None:
        if lock is not None:
            lock.release()
        raise HostUnfit(f"{why}; no job was claimed")
    spool = ResultSpool(engine.url.render_as_string(hide_password=True))
    watch = GpuWatch(config.gpu_uuid, log) if config.gpu_uuid else None
    try:
        return _loop(engine, config, watch, lock, spool, once=once, drain=drain,
                     should_stop=should_stop, log=log)
    finally:
        if lock is not None:
            lock.release()


def _next_job(engine: Any, config: WorkerConfig, watch: Any, lock: Any, spool: ResultSpool,
              should_stop: Callable[[], bool],
              log: Callable[[str], None]) -> tuple[Job | None, float]:
    """Between jobs: store what the spool holds, re-queue expired leases, keep the GPU
    lock, wait for a GPU others use, then claim: (the job or None, `lease.clock()` just
    before the claim was sent). Database errors propagate (retried)."""
    name = config.name or "worker"
    flush(engine, spool, log)
    for sid in requeue_own(engine, name):
        log(f"submission {sid}: claimed by a commit this worker did not hear of, re-queued")
        _event(config, event="requeued", id=sid)
    rq = requeue_stale(engine, lease_s=float(config.lease_s or 0),
                       max_attempts=config.max_attempts)
    dead = requeue_dead(engine, me=name, max_attempts=config.max_attempts)
    for sid in rq.requeued + dead.requeued:
        log(f"submission {sid}: " + ("lease expired" if sid in rq.requeued
                                     else "its worker is gone") + ", re-queued")
        _event(config, event="requeued", id=sid)
    for sid in rq.abandoned + dead.abandoned:
        log(f"submission {sid}: abandoned after {config.max_attempts} attempts")
    if lock is not None:
        lock.keep()
    if watch is not None and queue_depth(engine).get("queued", 0):
        hold_back(watch, config.busy_wait_s, config.poll_s, log, should_stop)
    sent = clock()
    return claim(engine, name), sent


def _loop(engine: Any, config: WorkerConfig, watch: Any, lock: Any, spool: ResultSpool, *,
          once: bool, drain: bool, should_stop: Callable[[], bool],
          log: Callable[[str], None]) -> int:
    done = 0
    streak = 0  # jobs in a row this host could not score
    backoff = Backoff(cap_s=max(5.0, config.poll_s))
    while not should_stop():
        got = retrying(lambda: _next_job(engine, config, watch, lock, spool, should_stop, log),
                       what="claiming", log=log, should_stop=should_stop, backoff=backoff)
        backoff.reset()
        if got is None:
            break  # told to stop while the database was away
        job, sent = got
        if job is None:
            if once or drain:
                break
            time.sleep(config.poll_s)
            continue
        log(f"submission {job.id} ({job.name}): scoring, attempt {job.attempts}")
        _event(config, event="claim", id=job.id, attempt=job.attempts, token=job.token)
        if watch is not None:
            watch.start()
        lease = Lease(engine, job, lease_s=float(config.lease_s or 0),
                      interval_s=config.heartbeat_s, log=log, since=sent).start()
        try:
            outcome = run_job(job, config, watch.sample if watch is not None else None,
                              abort=lease.lost.is_set, gate=lease.held)
        finally:
            lease.stop()
        gpu = watch.finish() if watch is not None else None
        if not lease.held():  # the last check before storing: lost, nothing of it counts
            _abandon(engine, config, job, lease, should_stop, log)
            continue
        fault = host_fault(outcome)
        if fault is not None:
            streak += 1
            _host_fault(engine, config, job, fault, should_stop, log)
            if streak >= config.host_fault_streak:
                raise HostUnfit(f"{streak} jobs in a row could not be scored on this host "
                                f"(last: {fault[:300]}); they were put back in the queue")
            continue
        streak = 0
        if gpu is not None:
            outcome.detail["gpu_sharing"] = gpu
        if gpu is not None and gpu["shared"]:
            if config.on_shared == "requeue" and job.attempts < config.max_attempts:
                ok = retrying(lambda j=job: release(engine, j, "re-queued: another process "
                                                    "used the GPU while it was being scored"),
                              what="re-queueing", log=log, should_stop=should_stop)
                log(f"submission {job.id}: GPU shared during scoring, re-queued"
                    + ("" if ok else " (claim lost)"))
                _event(config, event="release", id=job.id, attempt=job.attempts, shared=True)
                continue
            for o in (outcome, outcome.backward):
                if o is not None:
                    o.message = ("GPU shared with another process while scored: the score "
                                 "is not comparable. " + o.message)
        _describe(config, job, outcome)
        stored = store(engine, spool, job, outcome, log=log, should_stop=should_stop)
        _event(config, event="finish", id=job.id, attempt=job.attempts, stored=stored,
               verdict=outcome.verdict, score=outcome.score,
               shared=bool(gpu and gpu["shared"]))
        score = f" score {outcome.score:.3f}" if outcome.score is not None else ""
        b = outcome.backward
        if b is not None:  # the backward's own verdict, said apart from the forward's
            score += f"; backward {b.verdict}" + (f" {b.score:.3f}" if b.score is not None
                                                  else "")
        note = {True: "", False: " (claim lost; not stored)",
                None: " (kept in the spool until the database is back)"}[stored]
        log(f"submission {job.id} ({job.name}): {outcome.verdict}{score}: "
            f"{outcome.message[:300]}{note}")
        done += 1
        if once:
            break
    return done


def _abandon(engine: Any, config: WorkerConfig, job: Job, lease: Lease,
             should_stop: Callable[[], bool], log: Callable[[str], None]) -> None:
    """The lease of `job` was lost while it was scored: nothing of the attempt is stored
    (no verdict, no host fault); a job still this worker's claim is put back at once
    (its attempt counts, as one whose lease another worker found expired)."""
    back = retrying(lambda: release(engine, job, f"re-queued: its worker lost the lease "
                                    f"({lease.why})"),
                    what="giving the job back", log=log, should_stop=should_stop)
    log(f"submission {job.id}: abandoned, nothing of this attempt stored"
        + ("; re-queued" if back else ""))
    _event(config, event="abandon", id=job.id, attempt=job.attempts, requeued=bool(back),
           why=lease.why)


def _describe(config: WorkerConfig, job: Job, outcome: Any) -> None:
    """What is stored with a score beside it: the settings it was made under (the board
    ranks only scores made under the same ones) and the host faults before it."""
    settings = settings_of(config.scoring)
    for o in (outcome, outcome.backward):
        if o is not None:
            o.detail["settings"] = settings
    if job.host_faults:
        outcome.detail["host_faults"] = list(job.host_faults)


def _host_fault(engine: Any, config: WorkerConfig, job: Job, fault: str,
                should_stop: Callable[[], bool], log: Callable[[str], None]) -> None:
    res = retrying(lambda: requeue_host_fault(engine, job, fault,
                                              limit=config.host_fault_workers),
                   what="re-queueing", log=log, should_stop=should_stop)
    said = ("stored as an infrastructure error" if res == HOST_ERROR else
            "re-queued" if res else "left to its lease")
    log(f"submission {job.id}: the host could not score it ({fault[:300]}); {said}")
    _event(config, event="host_fault", id=job.id, attempt=job.attempts, result=res)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.submissions.worker")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--child", metavar="JOB")
    g.add_argument("--probe", metavar="SCORER")
    args = p.parse_args(argv)
    if args.probe is not None:
        return probe_main(args.probe)
    return child_main(args.child)


def config_dict(config: WorkerConfig) -> dict[str, Any]:
    d = asdict(config)
    d.pop("secret", None)
    return d


if __name__ == "__main__":
    sys.exit(main())
