"""Process trees and their memory, through psutil: what the watchdogs of harness.execution
.isolate and harness.submissions.worker_run read and kill.

psutil is imported when a function here is first called, not with this module: a host
without it can still import the harness and run everything that starts no watched child.

"A process's tree" is the process and its descendants; with `group=True` it also takes
every process of the process group the process leads. A scoring child runs in a group of
its own, and a grandchild whose parent died is reparented out of the tree but stays in
the group, so only the group finds it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil


def _psutil() -> ModuleType:
    try:
        import psutil
    except ModuleNotFoundError as e:  # say what to install, not just the import error
        raise ModuleNotFoundError(
            "watching child processes needs psutil: pip install 'psutil>=5.9'") from e
    return psutil


def tree(pid: int, *, group: bool = False) -> list[psutil.Process]:
    """The live processes of `pid`'s tree (the process first), empty when it is gone."""
    ps = _psutil()
    found: list[psutil.Process] = []
    with contextlib.suppress(ps.NoSuchProcess, ps.AccessDenied):
        root = ps.Process(pid)
        found = [root, *root.children(recursive=True)]
    if group:
        seen = {p.pid for p in found}
        for p in ps.process_iter():
            if p.pid in seen:
                continue
            # psutil has no process-group attribute; getpgid is one syscall per process.
            with contextlib.suppress(OSError):
                if os.getpgid(p.pid) == pid:
                    found.append(p)
    return found


def rss_mb(pid: int, *, whole_tree: bool = False, group: bool = False) -> float | None:
    """Resident host memory (MiB) of the process, or with `whole_tree` of its tree; None
    when the process is gone or cannot be read."""
    ps = _psutil()
    try:
        root = ps.Process(pid)
        total = root.memory_info().rss
        rest = [p for p in tree(pid, group=group) if p.pid != pid] if whole_tree else []
    except (ps.NoSuchProcess, ps.AccessDenied):
        return None
    for p in rest:
        # A descendant that exited between listing and reading holds nothing any more.
        with contextlib.suppress(ps.NoSuchProcess, ps.AccessDenied):
            total += p.memory_info().rss
    return total / 2**20


def alive(pid: int) -> bool:
    """Whether this process can see a process `pid` (not one of another pid namespace)."""
    return bool(_psutil().pid_exists(pid))


def kill_tree(pid: int, *, group: bool = False) -> None:
    """SIGKILL the process and its tree; the caller reaps its own child.

    The tree is listed before anything is killed: once the process dies its children are
    reparented and no longer found under it. With `group`, the group is killed first in
    one killpg, so a process forking at that moment cannot leave a child in it unkilled;
    the tree is then killed for descendants that left the group (setsid)."""
    ps = _psutil()
    procs = tree(pid, group=group)
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(ps.NoSuchProcess, ps.AccessDenied):
            p.send_signal(signal.SIGKILL)
