"""One worker per GPU: an exclusive lock per GPU UUID, and what else runs on the GPU.

Two layers, because workers meet in two places:
- processes of one host (where a GPU is shared) meet in a lock file per GPU UUID under
  a runtime directory all workers of the host see (`FA_HARNESS_LOCK_DIR`, else
  /run/lock/fa-harness, else <tmp>/fa-harness-locks), locked with flock(2): the kernel
  drops the lock when the holder dies, even by SIGKILL, so a stale lock cannot exist;
- workers that share a PostgreSQL queue also take a session advisory lock keyed by the
  UUID, which covers workers of the same host in different containers (separate /run and
  /tmp) as long as they use one database.
A GPU used by something that takes neither lock (another user's training job, a worker of
another queue) is found through NVML: `others_on_gpu` lists the compute processes there,
and the worker checks before and after every job (see harness.submissions.worker).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.execution import procs
from harness.measure import gpuinfo


class GpuBusy(RuntimeError):
    """The GPU is locked by another worker."""


class GpuMissing(ValueError):
    """The GPU asked for is not visible here."""


def lock_dir() -> Path:
    env = os.environ.get("FA_HARNESS_LOCK_DIR")
    if env:
        return Path(env).expanduser()
    run_lock = Path("/run/lock")
    if run_lock.is_dir() and os.access(run_lock, os.W_OK | os.X_OK):
        return run_lock / "fa-harness"
    return Path(tempfile.gettempdir()) / "fa-harness-locks"


def advisory_key(namespace: str, name: str) -> int:
    """A signed 64-bit key for pg_advisory_lock, stable across hosts and versions."""
    digest = hashlib.sha256(f"fa-harness:{namespace}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@dataclass
class GpuLock:
    """A held GPU lock; `release` (or the holder's exit) frees it."""

    key: str
    path: Path
    fd: int | None
    pg_conn: Any = None
    uuid: str | None = None  # the GPU's UUID, None when NVML could not name it
    note: str | None = None  # a caveat for the worker's log
    engine: Any = None  # the queue database whose advisory lock is held, if any
    pg_key: int | None = None

    def keep(self) -> None:
        """Make sure the database half of the lock is still held. A session the server
        dropped (a network cut, a restart) took its advisory lock with it, silently: take
        it again. Raises GpuBusy when another worker took the GPU meanwhile, and the
        database's own error when it cannot be reached (the worker waits and retries)."""
        if self.engine is None or self.pg_key is None:
            return
        if self.pg_conn is not None:
            from sqlalchemy import text

            try:
                self.pg_conn.execute(text("SELECT 1"))
                self.pg_conn.commit()
                return  # the session lives, and with it the lock
            except Exception:  # noqa: BLE001 - a dead session, whatever the driver says
                drop_session(self.pg_conn)
                self.pg_conn = None
        conn, ok = _try_pg(self.engine, self.pg_key)
        if not ok:
            raise GpuBusy(f"GPU {self.key}: its lock in the queue database was lost with a "
                          f"dropped connection and another worker holds it now")
        self.pg_conn = conn

    def release(self) -> None:
        if self.pg_conn is not None:
            drop_session(self.pg_conn)
            self.pg_conn = None
        if self.fd is not None:
            with contextlib.suppress(OSError):
                Path(f"{self.path}.owner").unlink(missing_ok=True)
            os.close(self.fd)  # closing the descriptor frees the flock
            self.fd = None

    def __enter__(self) -> GpuLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def drop_session(conn: Any) -> None:
    """End the database session of `conn` (a pooled connection would otherwise go back to
    the pool with its session advisory locks still held)."""
    with contextlib.suppress(Exception):
        conn.invalidate()
    with contextlib.suppress(Exception):
        conn.close()


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", key)[:120] or "gpu"


def _owner(path: Path) -> str:
    try:
        d = json.loads(Path(f"{path}.owner").read_text())
        return f" (held by {d.get('owner')}, since {d.get('since')})"
    except (OSError, ValueError, AttributeError):
        return ""


def _try_file(path: Path) -> int | None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(path.parent, 0o1777)  # every worker user of the host shares the directory
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _try_pg(engine: Any, key: int) -> tuple[Any, bool]:
    from sqlalchemy import text

    conn = engine.connect()
    try:
        ok = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())
        conn.commit()  # a session lock outlives the transaction; keep no transaction open
    except Exception:
        conn.close()
        raise
    if not ok:
        conn.close()
        return None, False
    return conn, True


def acquire(key: str, *, engine: Any = None, owner: str = "", wait: bool = False,
            timeout_s: float | None = None, poll_s: float = 1.0,
            directory: Path | None = None) -> GpuLock:
    """Lock the GPU `key` (its UUID) for this process. Raises GpuBusy when another worker
    holds it (at once, or after `timeout_s` when `wait`)."""
    path = (directory or lock_dir()) / f"gpu-{_safe(key)}.lock"
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pg = engine is not None and getattr(engine.dialect, "name", "") == "postgresql"
    while True:
        fd = _try_file(path)
        where = f"lock file {path}{_owner(path)}"
        if fd is not None:
            try:
                conn, ok = (_try_pg(engine, advisory_key("gpu", key)) if pg
                            else (None, True))
            except Exception:
                os.close(fd)  # a database that cannot be reached: the caller tries again
                raise
            if ok:
                lock = GpuLock(key, path, fd, conn)
                if pg:
                    lock.engine, lock.pg_key = engine, advisory_key("gpu", key)
                with contextlib.suppress(OSError):
                    Path(f"{path}.owner").write_text(json.dumps(
                        {"owner": owner or f"pid {os.getpid()}",
                         "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
                return lock
            os.close(fd)
            where = "a PostgreSQL advisory lock of the queue database (a worker elsewhere)"
        if not wait or (deadline is not None and time.monotonic() >= deadline):
            raise GpuBusy(f"GPU {key} is taken by another worker: {where}")
        time.sleep(poll_s)


def others_on_gpu(uuid: str, ours: set[int] | None = None) -> list[gpuinfo.GpuProcess]:
    """Compute processes on the GPU that are not in `ours` (pids). Raises RuntimeError when
    NVML cannot tell."""
    ours = ours or set()
    return [p for p in gpuinfo.compute_processes(uuid) if p.pid not in ours]


def _group_pids(pid: int) -> set[int]:
    """The pids of the process group led by `pid` (the scoring child and what it started)."""
    return {p.pid for p in procs.tree(pid, group=True)} | {pid}


@dataclass
class GpuWatch:
    """What else ran on the worker's GPU around one job.

    Before the job and after it nothing of the worker runs on the GPU (the worker itself
    never opens a CUDA context), so every process NVML lists then is another one. While
    the child runs, a listed pid outside the child's process group counts only when this
    process can see it: inside a container NVML may report host pids, and an
    unknown pid there cannot be told from the child itself."""

    uuid: str
    log: Callable[[str], None] = lambda _m: None
    before: list[int] = field(default_factory=list)
    during: set[int] = field(default_factory=set)
    after: list[int] = field(default_factory=list)
    error: str | None = None

    def others_now(self) -> list[int]:
        try:
            return [p.pid for p in others_on_gpu(self.uuid)]
        except RuntimeError as e:
            self.error = str(e)
            return []

    def start(self) -> None:
        self.before, self.during, self.after, self.error = self.others_now(), set(), [], None

    def sample(self, child_pid: int) -> None:
        try:
            listed = gpuinfo.compute_processes(self.uuid)
        except RuntimeError as e:
            self.error = str(e)
            return
        ours = _group_pids(child_pid)
        self.during |= {p.pid for p in listed
                        if p.pid not in ours and procs.alive(p.pid)}

    def finish(self, settle_s: float = 0.5, tries: int = 3) -> dict[str, Any]:
        # A just-killed child can stay listed for a moment while the driver tears down its
        # context: only a process still there after a few looks counts.
        seen = set(self.others_now())
        for _ in range(tries - 1):
            if not seen:
                break
            time.sleep(settle_s)
            seen &= set(self.others_now())
        self.after = sorted(seen)
        shared = bool(self.before or self.during or self.after)
        if shared:
            self.log(f"GPU {self.uuid} shared during the job: pids before "
                     f"{self.before}, during {sorted(self.during)}, after {self.after}")
        # Stored with the submission (shown to its submitter): counts, never host pids.
        return {"uuid": self.uuid, "others_before": len(self.before),
                "others_during": len(self.during), "others_after": len(self.after),
                "shared": shared, "nvml_error": self.error}


def lock_gpu(engine: Any, gpu: int | str, *, owner: str, wait: bool = False) -> GpuLock:
    """Resolve the worker's `gpu` (a visible-GPU position or a GPU-... UUID) and lock it.
    Without NVML the lock is keyed by host and index, and `note` says so. Raises GpuBusy,
    or GpuMissing for a GPU that is not there."""
    try:
        uuid: str | None = gpuinfo.resolve_gpu(gpu).uuid
        note = None
    except ValueError as e:
        raise GpuMissing(str(e)) from None
    except RuntimeError as e:
        uuid = None
        note = (f"{e}: GPU {gpu} locked by its index on this host; other processes on it "
                f"cannot be seen")
    import socket

    key = uuid or f"{socket.gethostname()}-index-{gpu}"
    lock = acquire(key, engine=engine, owner=owner, wait=wait)
    lock.uuid, lock.note = uuid, note
    return lock


def hold_back(watch: GpuWatch, limit_s: float, poll_s: float, log: Callable[[str], None],
              should_stop: Callable[[], bool]) -> None:
    """Wait (at most `limit_s`) until no other process uses the GPU, before claiming."""
    deadline = time.monotonic() + limit_s
    said = False
    while not should_stop() and time.monotonic() < deadline:
        others = watch.others_now()
        if not others:
            return
        if not said:
            log(f"GPU {watch.uuid}: {len(others)} other compute process(es) "
                f"(pids {others[:8]}); waiting before claiming")
            said = True
        time.sleep(poll_s)
