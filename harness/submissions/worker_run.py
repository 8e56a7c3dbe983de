"""The worker's parent side of one job: its configuration, and the child process that
scores the job under watch (see harness.submissions.worker for what the watchdog
enforces), plus the host's check before a worker takes any job (`preflight`).

A child that fails before its first progress line (importing torch, opening the CUDA
context: nothing of the submission has run yet) is the host's fault, never the
submission's: its outcome has status "error", and the worker re-queues the job.
"""

from __future__ import annotations

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.execution import procs
from harness.submissions.lease import ABANDONED, ChildGate
from harness.submissions.queue import DONE, ERROR, Job, Outcome
from harness.submissions.worker_child import DEFAULT_SCORER, read_result, with_forward

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
    # A running job's lease is renewed this often (database clock, see queue).
    heartbeat_s: float = 10.0
    # A job the host could not score is an infrastructure error once it failed on this
    # many different workers; this worker stops after this many such jobs in a row.
    host_fault_workers: int = 2
    host_fault_streak: int = 2
    # Check that the host can score (`preflight`) before taking any job.
    preflight: bool = False
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
    """Resident memory (MiB) of the scoring child and everything of its process group (it
    leads one: what it started counts against the job's limit)."""
    return procs.rss_mb(pid, whole_tree=True, group=True) or 0.0


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
    if proc.returncode is None:  # not reaped: its pid is still its own
        procs.kill_tree(proc.pid, group=True)
    else:
        # Reaped: the pid may already be another process's, but not the group id, which
        # stays taken while any member lives.
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
            sample: Callable[[int], None] | None = None,
            abort: Callable[[], bool] | None = None,
            gate: Callable[[], bool] | None = None) -> Outcome:
    """Score one job in a child process under the limits of `config`; never raises.
    `sample(child_pid)` is called about once a second while the child runs; when
    `abort()` turns true (the claim was lost) the child is stopped. `gate()` answers the
    child before each of its stages and cases and before its result: False stops it
    there (harness.submissions.lease); without it the child asks nobody."""
    try:
        return _run_job(job, config, sample, abort or (lambda: False), gate)
    except Exception as e:  # noqa: BLE001 - the worker must survive anything
        return Outcome("crashed", f"worker error while running the job: "
                       f"{type(e).__name__}: {e}", status=ERROR)


def _child_env(config: WorkerConfig) -> dict[str, str]:
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
    return env


def _run_job(job: Job, config: WorkerConfig, sample: Callable[[int], None] | None,
             abort: Callable[[], bool], gate: Callable[[], bool] | None) -> Outcome:
    child_gate = ChildGate(gate) if gate is not None else None
    try:
        return _watch_job(job, config, sample, abort, child_gate)
    finally:
        if child_gate is not None:
            child_gate.close()


def _watch_job(job: Job, config: WorkerConfig, sample: Callable[[int], None] | None,
               abort: Callable[[], bool], child_gate: ChildGate | None) -> Outcome:
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
                   "gpu_memory_fraction": config.gpu_memory_fraction,
                   "gate": child_gate.child_fd if child_gate is not None else None}
        fd = os.open(job_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(job_doc, f)
        env = _child_env(config)
        started = time.monotonic()
        last_change = started
        last_seen: tuple[str, str, float | None, float | None] = ("start", "", None, None)
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "harness.submissions.worker", "--child", str(job_path)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env,
                start_new_session=True, cwd=tmp, preexec_fn=_die_with_parent,
                pass_fds=(child_gate.child_fd,) if child_gate is not None else ())
            if child_gate is not None:
                child_gate.started()
            killed: Outcome | None = None
            sampled = started
            while proc.poll() is None:
                time.sleep(0.2)
                if proc.poll() is not None:
                    break  # done while this loop slept (or its worker was stopped)
                now = time.monotonic()
                if sample is not None and now - sampled >= 1.0:
                    sampled = now
                    sample(proc.pid)
                if abort() or (child_gate is not None and child_gate.refused.is_set()):
                    _kill_group(proc)
                    killed = Outcome("crashed", "stopped: the lease was lost", status=ERROR)
                    break
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
                                                     "message": at}],
                                     status=ERROR if starting else DONE)
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
        # The watchdog reads the progress file once per round, then the memory (a walk of
        # every process, slow on a loaded machine): a child that writes its last lines and
        # dies in between would be blamed on an earlier stage. The file as it left it names
        # the case.
        stage, case, _, _ = _last_progress(progress_path)
        code = proc.returncode
        if code == ABANDONED and child_gate is not None and child_gate.refused.is_set():
            return Outcome("crashed", "stopped at its worker's word: the lease was lost",
                           detail={"elapsed_s": elapsed}, status=ERROR)
        how = (f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with code {code}")
        tail = _tail(stderr_path)
        msg = f"the scoring process {how} during {stage} {case}".rstrip()
        if tail:
            msg += f": {tail.splitlines()[-1][:500]}"
        # Dead before its first progress line: the host's start-up failed, not the job.
        return with_forward(result_path, Outcome(
            "crashed", msg, failing_cases=[{"case": case, "status": "crashed", "message": how}]
            if case else [], detail={"elapsed_s": elapsed, "stderr_tail": tail},
            status=ERROR if stage == "start" else DONE))


# Driver and device messages that say the host, not the submission, failed.
HOST_FAULT_MARKERS = (
    "no CUDA-capable device is detected", "CUDA driver version is insufficient",
    "busy or unavailable", "GPU is lost", "fallen off the bus", "no usable CUDA GPU",
    "cudaErrorNoDevice", "cudaErrorInsufficientDriver", "NVML_ERROR_GPU_IS_LOST",
)


def host_fault(outcome: Outcome) -> str | None:
    """Why `outcome` is the host's failure rather than a verdict on the submission (the
    runner could not score it: status "error", or a driver message that says the device
    is gone), or None."""
    if outcome.status == ERROR:
        return outcome.message or outcome.verdict
    low = (outcome.message or "").lower()
    if outcome.verdict == "crashed" and any(m.lower() in low for m in HOST_FAULT_MARKERS):
        return outcome.message
    return None


def preflight(config: WorkerConfig, timeout_s: float = 300.0) -> str | None:
    """Whether this host can score at all, asked of a child with the scoring children's
    environment (the worker itself never opens a CUDA context): None when it can, else
    the reason in one line. The scorer's module may define `probe()` for that; the
    default scorer's probe wants a CUDA GPU that runs a kernel."""
    cmd = [sys.executable, "-m", "harness.submissions.worker", "--probe", config.scorer]
    try:
        p = subprocess.run(cmd, env=_child_env(config), stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"the GPU check did not finish in {timeout_s:g} s"
    if p.returncode == 0:
        return None
    lines = (p.stdout.strip() or p.stderr.strip() or f"exit code {p.returncode}").splitlines()
    return lines[-1][:500]


