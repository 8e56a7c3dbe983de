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
Whatever happens, the worker writes a verdict and takes the next job: it survives every
bad submission. Jobs abandoned by a dead worker are re-queued after a lease (see
harness.submissions.queue).

The secret mixed into every case seed is worker configuration: `FA_HARNESS_SECRET` (an
integer) or, when unset, a random value per worker start. It is handed to the child in
the job file (mode 0600, in a private temporary folder) and never stored with results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.submissions.gpulock import GpuWatch, drop_session, hold_back, lock_gpu
from harness.submissions.queue import (
    Job,
    Outcome,
    claim,
    finish,
    hold_liveness,
    queue_depth,
    release,
    requeue_dead,
    requeue_stale,
)
from harness.submissions.worker_child import (
    DEFAULT_SCORER,
    child_main,
    read_result,
    with_forward,
)

STDERR_TAIL = 2000


@dataclass
class WorkerConfig:
    gpu: int | str | None = None  # a position among the visible GPUs, or a GPU-... UUID
    case_timeout_s: float = 300.0
    # Before its first progress line the child is importing torch and starting up: a
    # separate, larger allowance, so a loaded machine is not taken for a hung kernel.
    startup_timeout_s: float = 120.0
    job_timeout_s: float = 3600.0
    memory_limit_mb: int = 32768
    gpu_memory_fraction: float | None = 0.9
    lease_s: float | None = None  # default: job_timeout_s + 10 minutes
    max_attempts: int = 3
    poll_s: float = 2.0
    secret: int | None = None
    scorer: str = DEFAULT_SCORER
    scoring: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    wait_for_gpu: bool = False  # wait for another worker's GPU lock instead of refusing
    busy_wait_s: float = 300.0  # how long to hold back claims while others use the GPU
    on_shared: str = "requeue"  # or "mark": what a job timed on a shared GPU becomes
    events: str | None = None  # JSON lines of claims and finishes (benchmarks, audits)
    # Filled in by `work` once the GPU is resolved and locked.
    gpu_uuid: str | None = None

    def __post_init__(self) -> None:
        if self.lease_s is None:
            self.lease_s = self.job_timeout_s + 600.0
        if self.secret is None:
            env = os.environ.get("FA_HARNESS_SECRET")
            self.secret = int(env) if env else secrets.randbits(63)
        if self.name is None:
            gpu = "cpu" if self.gpu is None else f"gpu{self.gpu}"[:40]
            self.name = f"{socket.gethostname()}:{os.getpid()}:{gpu}"


# ----------------------------------------------------------------------------- parent


def _rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (MiB), from /proc."""
    total = 0.0
    pids = [pid]
    try:
        out = subprocess.run(["pgrep", "-g", str(os.getpgid(pid))], capture_output=True,
                             text=True, timeout=5).stdout.split()
        pids = [int(p) for p in out] or [pid]
    except (OSError, subprocess.SubprocessError, ProcessLookupError, ValueError):
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except (OSError, ValueError):
            continue
    return total


def _last_progress(path: Path) -> tuple[str, str, float | None, float | None]:
    """(stage, case, time, allowance) of the last progress line, or ("start", "", None,
    None). The allowance is the seconds a stage announces it may take without a new line
    (the sanitizer stage: its own timeout), else None (the case timeout applies)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return "start", "", None, None
    for line in reversed(lines):
        try:
            d = json.loads(line)
            allow = d.get("allow_s")
            return (d.get("stage", ""), d.get("case", ""), float(d.get("t", 0.0)),
                    None if allow is None else float(allow))
        except (ValueError, TypeError):
            continue
    return "start", "", None, None


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()[-STDERR_TAIL:]
    except OSError:
        return ""
    return data.decode("utf-8", "replace").strip()


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the worker dies (Linux PR_SET_PDEATHSIG), so
    a killed worker leaves no scoring process behind on its GPU."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def run_job(job: Job, config: WorkerConfig,
            sample: Callable[[int], None] | None = None) -> Outcome:
    """Score one job in a child process under the limits of `config`; never raises.
    `sample(child_pid)` is called about once a second while the child runs."""
    try:
        return _run_job(job, config, sample)
    except Exception as e:  # noqa: BLE001 - the worker must survive anything
        return Outcome("crashed", f"worker error while running the job: "
                       f"{type(e).__name__}: {e}", status="error")


def _run_job(job: Job, config: WorkerConfig,
             sample: Callable[[int], None] | None) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="fa-job-") as tmp:
        tmpdir = Path(tmp)
        os.chmod(tmpdir, 0o700)
        progress_path = tmpdir / "progress.jsonl"
        result_path = tmpdir / "result.json"
        job_path = tmpdir / "job.json"
        stderr_path = tmpdir / "stderr.txt"
        job_doc = {"id": job.id, "files": job.files, "options": config.scoring,
                   "secret": config.secret, "progress": str(progress_path),
                   "result": str(result_path), "scorer": config.scorer,
                   "gpu_memory_fraction": config.gpu_memory_fraction}
        fd = os.open(job_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(job_doc, f)
        env = dict(os.environ)
        env.pop("FA_HARNESS_SECRET", None)  # the child gets it from the job file only
        if config.gpu is not None:
            # The UUID names one GPU whatever the numbering (CUDA_DEVICE_ORDER) says.
            env["CUDA_VISIBLE_DEVICES"] = config.gpu_uuid or str(config.gpu)
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        # The child imports this project; keep its root importable when not installed.
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                    else "")
        started = time.monotonic()
        last_change = started
        last_seen: tuple[str, str, float | None, float | None] = ("start", "", None, None)
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "harness.submissions.worker", "--child", str(job_path)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env,
                start_new_session=True, cwd=tmp, preexec_fn=_die_with_parent)
            killed: Outcome | None = None
            sampled = started
            while proc.poll() is None:
                time.sleep(0.2)
                now = time.monotonic()
                if sample is not None and now - sampled >= 1.0:
                    sampled = now
                    sample(proc.pid)
                seen = _last_progress(progress_path)
                if seen != last_seen:
                    last_seen, last_change = seen, now
                stage, case, _, announced = last_seen
                at = f"{stage} {case}".strip()
                starting = last_seen[2] is None
                allowed = (config.startup_timeout_s if starting else
                           max(config.case_timeout_s, announced or 0.0))
                if now - last_change > allowed:
                    _kill_group(proc)
                    what = "did not start" if starting else "no progress"
                    killed = Outcome("timeout", f"{case or stage}: {what} for {allowed:g} s "
                                     f"({at}); the scoring process was stopped",
                                     failing_cases=[{"case": case, "status": "timeout",
                                                     "message": at}])
                    break
                if now - started > config.job_timeout_s:
                    _kill_group(proc)
                    killed = Outcome("timeout", f"scoring exceeded the job limit of "
                                     f"{config.job_timeout_s:g} s (at {at})")
                    break
                rss = _rss_mb(proc.pid)
                if rss > config.memory_limit_mb:
                    _kill_group(proc)
                    killed = Outcome("crashed", f"host memory {rss:.0f} MiB above the limit of "
                                     f"{config.memory_limit_mb} MiB (at {at})")
                    break
            if killed is not None:
                killed.detail = {"elapsed_s": round(time.monotonic() - started, 2)}
                return with_forward(result_path, killed)
        # The child is gone; make sure nothing of its group lingers.
        _kill_group(proc)
        elapsed = round(time.monotonic() - started, 2)
        try:
            done, pending = read_result(result_path)
        except (ValueError, KeyError, TypeError) as e:
            return Outcome("crashed", f"the scoring child wrote an unreadable result: {e}")
        if done is not None and not pending:
            done.detail["elapsed_s"] = elapsed
            return done
        # The watchdog reads the progress file once per round, then the memory (a pgrep,
        # slow on a loaded machine): a child that writes its last lines and dies in
        # between would be blamed on an earlier stage. The file as it left it names the case.
        stage, case, _, _ = _last_progress(progress_path)
        code = proc.returncode
        how = (f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with code {code}")
        tail = _tail(stderr_path)
        msg = f"the scoring process {how} during {stage} {case}".rstrip()
        if tail:
            msg += f": {tail.splitlines()[-1][:500]}"
        return with_forward(result_path, Outcome(
            "crashed", msg, failing_cases=[{"case": case, "status": "crashed", "message": how}]
            if case else [], detail={"elapsed_s": elapsed, "stderr_tail": tail}))


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
    is not there."""
    log = log or (lambda _m: None)
    should_stop = should_stop or (lambda: False)
    name = config.name or "worker"
    lock = None
    if config.gpu is not None:
        lock = lock_gpu(engine, config.gpu, owner=name, wait=config.wait_for_gpu)
        config.gpu_uuid = lock.uuid
        if lock.note:
            log(lock.note)
    alive = hold_liveness(engine, name)
    watch = GpuWatch(config.gpu_uuid, log) if config.gpu_uuid else None
    try:
        return _loop(engine, config, watch, once=once, drain=drain,
                     should_stop=should_stop, log=log)
    finally:
        if alive is not None:
            drop_session(alive)
        if lock is not None:
            lock.release()


def _loop(engine: Any, config: WorkerConfig, watch: Any, *, once: bool, drain: bool,
          should_stop: Callable[[], bool], log: Callable[[str], None]) -> int:
    done = 0
    name = config.name or "worker"
    while not should_stop():
        rq = requeue_stale(engine, lease_s=float(config.lease_s or 0),
                           max_attempts=config.max_attempts)
        dead = requeue_dead(engine, me=name, max_attempts=config.max_attempts)
        for sid in rq.requeued + dead.requeued:
            log(f"submission {sid}: " + ("lease expired" if sid in rq.requeued
                                         else "its worker is gone") + ", re-queued")
            _event(config, event="requeued", id=sid)
        for sid in rq.abandoned + dead.abandoned:
            log(f"submission {sid}: abandoned after {config.max_attempts} attempts")
        if watch is not None and queue_depth(engine).get("queued", 0):
            hold_back(watch, config.busy_wait_s, config.poll_s, log, should_stop)
        job = claim(engine, name)
        if job is None:
            if once or drain:
                break
            time.sleep(config.poll_s)
            continue
        log(f"submission {job.id} ({job.name}): scoring, attempt {job.attempts}")
        _event(config, event="claim", id=job.id, attempt=job.attempts)
        if watch is not None:
            watch.start()
        outcome = run_job(job, config, watch.sample if watch is not None else None)
        gpu = watch.finish() if watch is not None else None
        if gpu is not None:
            outcome.detail["gpu_sharing"] = gpu
        if gpu is not None and gpu["shared"]:
            if config.on_shared == "requeue" and job.attempts < config.max_attempts:
                ok = release(engine, job, "re-queued: another process used the GPU while "
                             "it was being scored")
                log(f"submission {job.id}: GPU shared during scoring, re-queued"
                    + ("" if ok else " (claim lost)"))
                _event(config, event="release", id=job.id, attempt=job.attempts, shared=True)
                continue
            for o in (outcome, outcome.backward):
                if o is not None:
                    o.message = ("GPU shared with another process while scored: the score "
                                 "is not comparable. " + o.message)
        stored = finish(engine, job, outcome)
        _event(config, event="finish", id=job.id, attempt=job.attempts, stored=stored,
               verdict=outcome.verdict, score=outcome.score,
               shared=bool(gpu and gpu["shared"]))
        score = f" score {outcome.score:.3f}" if outcome.score is not None else ""
        b = outcome.backward
        if b is not None:  # the backward's own verdict, said apart from the forward's
            score += f"; backward {b.verdict}" + (f" {b.score:.3f}" if b.score is not None
                                                  else "")
        log(f"submission {job.id} ({job.name}): {outcome.verdict}{score}: "
            f"{outcome.message[:300]}" + ("" if stored else " (claim lost; not stored)"))
        done += 1
        if once:
            break
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.submissions.worker")
    p.add_argument("--child", metavar="JOB", required=True)
    args = p.parse_args(argv)
    return child_main(args.child)


def config_dict(config: WorkerConfig) -> dict[str, Any]:
    d = asdict(config)
    d.pop("secret", None)
    return d


if __name__ == "__main__":
    sys.exit(main())
