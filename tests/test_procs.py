"""harness.execution.procs: a process's tree and group, their memory, and killing them, on
real processes (a shell that starts a sleeper, and one that leaves an orphan behind)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from harness.execution import procs

# A parent that starts a grandchild and waits, and prints the grandchild's pid.
TREE = "sleep 60 & echo $!; wait"


def _start(script: str, **kw) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True, **kw)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_the_tree_and_its_memory():
    proc, grandchild = _start(TREE)
    try:
        assert [p.pid for p in procs.tree(proc.pid)] == [proc.pid, grandchild]
        alone = procs.rss_mb(proc.pid)
        both = procs.rss_mb(proc.pid, whole_tree=True)
        assert alone is not None and both is not None and 0 < alone < both
        assert procs.alive(proc.pid)
    finally:
        procs.kill_tree(proc.pid)
        proc.wait(10)
    assert _gone(grandchild)
    assert procs.tree(proc.pid) == [] and procs.rss_mb(proc.pid) is None


def test_a_group_keeps_an_orphan_the_tree_has_lost():
    """The grandchild's parent exits: the grandchild is reparented out of the tree but is
    still in the group, which kill_tree(group=True) kills."""
    proc, orphan = _start("sleep 60 & echo $!", start_new_session=True)
    proc.wait(10)
    try:
        assert orphan not in [p.pid for p in procs.tree(proc.pid)]
        assert orphan in [p.pid for p in procs.tree(proc.pid, group=True)]
        procs.kill_tree(proc.pid, group=True)
        assert _gone(orphan)
    finally:
        if not _gone(orphan, 0):
            psutil.Process(orphan).kill()


def test_killing_a_python_child_takes_what_it_started():
    code = "import subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); " \
           "print(p.pid, flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    sleeper = int(proc.stdout.readline())
    procs.kill_tree(proc.pid)
    proc.wait(10)
    assert proc.returncode == -9 and _gone(sleeper)
