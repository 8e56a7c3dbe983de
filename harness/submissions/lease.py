"""A running job's lease as its worker holds it, and the gate its scoring child passes.

A worker scores a job only while it holds the job's lease (harness.submissions.queue: the
row is still its claim, by the claim's token, and its last heartbeat is younger than the
lease by the database's clock). `Lease` keeps that knowledge in the worker:
- a thread renews the lease every `interval_s` (`queue.heartbeat`, which renews only a
  lease that is still this claim's and has not expired: a lease that ran out, or that
  another worker re-queued or claimed, is never renewed again);
- a renewal that went through moves a local bound forward: `lease_s` (less a margin) from
  the moment the renewal was sent, on a clock that runs on while the worker is stopped or
  the host suspended. Before that bound the lease is held without asking the database
  (its expiry on the database's clock cannot come sooner); past it, only the database
  can say, and a database that cannot be reached then says "lost" (another worker may
  already have the job);
- `held()` is the check before each step: lost once, lost for good (`lost`, `why`).

The scoring child runs in its own process group, so a worker that is stopped (SIGSTOP, a
debugger, a frozen container) does not stop it: left alone it would score on, unwatched,
while the lease runs out and another worker scores the same job. So the child asks its
worker before every stage and case it starts and before it writes any result
(`ask_gate`, over a socket pair made by `ChildGate`): the worker answers from `held()`,
and a child told no, or whose worker is gone, exits at once (`ABANDONED`). A stopped
worker answers nothing, so its child waits at its next step; when the worker resumes
past its lease, the answer is no and the job is abandoned, not scored.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from harness.submissions.queue import Job, heartbeat
from harness.submissions.worker_store import DB_DOWN, first_line

Log = Callable[[str], None]
# The scoring child's exit code when its worker told it to stop (the lease was lost).
ABANDONED = 75
_GO, _STOP, _ASK = b"+", b"-", b"?"


def clock() -> float:
    """Seconds on a clock that also runs while this process is stopped or the host
    suspended (CLOCK_BOOTTIME on Linux, else the monotonic clock)."""
    boot = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boot) if boot is not None else time.monotonic()


class Lease:
    """The lease of the claimed `job`, renewed every `interval_s` from a daemon thread
    between `start` and `stop`. `since`: `clock()` just before the claim was sent."""

    def __init__(self, engine: Any, job: Job, *, lease_s: float, interval_s: float,
                 log: Log, since: float | None = None) -> None:
        self.engine, self.job, self.log = engine, job, log
        self.lease_s, self.interval_s = float(lease_s), float(interval_s)
        # Clocks of two hosts may run at slightly different rates.
        self.margin_s = min(1.0 + 0.02 * self.lease_s, self.lease_s / 4)
        self.until = (clock() if since is None else since) + self.lease_s - self.margin_s
        self.lost = threading.Event()
        self.why = ""
        self.failures = 0
        self.last_error = ""
        self._lock = threading.Lock()  # one renewal at a time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"lease-{job.id}")

    def start(self) -> Lease:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        # A renewal stuck on an unreachable server ends with its connect timeout; the
        # thread is a daemon and its answer is no longer needed.
        self._thread.join(timeout=1.0)

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            self.why = why
            self.log(f"submission {self.job.id}: lease lost: {why}")
            self.lost.set()

    def _renew(self) -> bool | None:
        """One renewal (the caller holds the lock): True renewed, False lost, None the
        database could not be asked."""
        sent = clock()
        try:
            ok = heartbeat(self.engine, self.job, lease_s=self.lease_s)
        except Exception as e:  # noqa: BLE001 - a heartbeat never takes the worker down
            self.failures += 1
            if not isinstance(e, DB_DOWN):
                self.log(f"submission {self.job.id}: heartbeat error {first_line(e)}")
            self.last_error = first_line(e)
            return None
        if ok:
            self.until = max(self.until, sent + self.lease_s - self.margin_s)
        else:
            self._lose(f"it expired or another worker took the job: nothing renewed it "
                       f"for over {self.lease_s:g} s")
        return ok

    def held(self) -> bool:
        """Whether the job may go on: the lease is not lost and is known held, before its
        local bound without asking, past it by a renewal that the database accepted."""
        if self.lost.is_set():
            return False
        if clock() < self.until:
            return True
        with self._lock:
            if not self.lost.is_set() and clock() >= self.until and self._renew() is None:
                self._lose(f"{self.lease_s:g} s without a renewal and the database "
                           f"unreachable: another worker may have the job")
        return not self.lost.is_set()

    def _run(self) -> None:
        down = False
        while not self._stop.wait(self.interval_s):
            with self._lock:
                if self.lost.is_set():
                    return
                renewed = self._renew()
            if self._stop.is_set():
                return  # a beat that outlived its job (slow on a failing server): moot
            if renewed is None:
                if clock() >= self.until:
                    self.held()  # past the bound: one more try, else lost
                    if self.lost.is_set():
                        return
                if not down:
                    self.log(f"submission {self.job.id}: heartbeat failed "
                             f"({self.last_error}); the job goes on "
                             f"while its lease lasts")
                down = True
                continue
            if down:
                self.log(f"submission {self.job.id}: heartbeat back")
                down = False
            if not renewed:
                return


class ChildGate:
    """The worker's end of the scoring child's gate: a socket pair whose child end is
    handed to the child (`child_fd`, kept open across exec); a thread answers each of
    the child's asks with `held()`. `refused` is set once it answered no."""

    def __init__(self, held: Callable[[], bool]) -> None:
        self.held = held
        self._ours, self._theirs = socket.socketpair()
        self._theirs.set_inheritable(True)
        self.child_fd = self._theirs.fileno()
        self.refused = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="child-gate")

    def started(self) -> None:
        """The child has its end: close ours of it and start answering."""
        self._theirs.close()
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                got = self._ours.recv(1)
            except OSError:
                return
            if not got:
                return  # the child is gone
            ok = self.held()
            if not ok:
                self.refused.set()
            try:
                self._ours.sendall(_GO if ok else _STOP)
            except OSError:
                return

    def close(self) -> None:
        for s in (self._ours, self._theirs):
            # shutdown first: it wakes the thread blocked in recv, close alone does not.
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)


def ask_gate(fd: int | None) -> bool:
    """In the scoring child: may it go on? Blocks until its worker answers (a stopped
    worker answers nothing: its child waits). False when told no or the worker is gone;
    True without a gate (`fd` None: a child run by hand)."""
    if fd is None:
        return True
    s = _gate_socket(fd)
    try:
        s.sendall(_ASK)
        return s.recv(1) == _GO
    except OSError:
        return False


_sockets: dict[int, socket.socket] = {}


def _gate_socket(fd: int) -> socket.socket:
    if fd not in _sockets:
        _sockets[fd] = socket.socket(fileno=fd)
    return _sockets[fd]
