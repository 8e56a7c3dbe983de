"""What `fa-harness bisect` asks of git: the commits of a range, and a throwaway checkout
of each (`git worktree add --detach`), removed afterwards whatever happens.

Every failure here is a `GitError`: one line for the user (the command exits 2).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

GIT_TIMEOUT_S = 120.0  # a worktree checkout of a large repository is the slowest call


class GitError(ValueError):
    """git is missing, or the repository or range cannot be bisected."""


def git(args: Sequence[str], cwd: Path, *, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
    except FileNotFoundError:
        raise GitError("git not found on PATH: bisect checks out commits with git") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"git {' '.join(args[:2])} took more than {GIT_TIMEOUT_S:.0f} s") \
            from None
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        raise GitError(f"git {' '.join(args[:3])}: {err[-1] if err else 'failed'}")
    return proc


def repo_root(cwd: Path) -> Path:
    proc = git(["rev-parse", "--show-toplevel"], cwd, check=False)
    if proc.returncode != 0:
        raise GitError(f"{cwd} is not inside a git repository")
    return Path(proc.stdout.strip())


def resolve(root: Path, rev: str) -> str:
    """The full hash of commit `rev`."""
    proc = git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], root, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise GitError(f"{rev!r} names no commit of {root}")
    return proc.stdout.strip()


def is_ancestor(root: Path, a: str, b: str) -> bool:
    proc = git(["merge-base", "--is-ancestor", a, b], root, check=False)
    if proc.returncode not in (0, 1):
        raise GitError(f"git merge-base {a[:12]} {b[:12]}: {proc.stderr.strip()}")
    return proc.returncode == 0


def commit_range(root: Path, good: str, bad: str) -> list[str]:
    """[good, the commits between, bad], oldest first. The first-parent chain from bad
    back to good where good lies on it (a merge is one step, as the gate saw it: it ran
    on the branch's commits, not on those of the merged branch); else every commit on a
    path from good to bad, in topological order."""
    good, bad = resolve(root, good), resolve(root, bad)
    if good == bad:
        raise GitError(f"--good and --bad are the same commit {good[:12]}: not a range")
    if not is_ancestor(root, good, bad):
        raise GitError(f"{good[:12]} is not an ancestor of {bad[:12]}: not a range "
                       "(the last good commit must come before the first bad one)")
    first = git(["rev-list", "--first-parent", f"{good}..{bad}"], root).stdout.split()
    chain = first[::-1]
    parent = git(["rev-parse", f"{chain[0]}^"], root, check=False).stdout.strip()
    if parent != good:  # good is not on bad's first-parent chain
        chain = git(["rev-list", "--reverse", "--topo-order", "--ancestry-path",
                     f"{good}..{bad}"], root).stdout.split()
    return [good, *chain]


def dirty(root: Path) -> list[str]:
    """Tracked files with uncommitted changes (untracked build outputs do not count)."""
    out = git(["status", "--porcelain", "--untracked-files=no"], root).stdout
    return [line[3:] for line in out.splitlines() if line.strip()]


def worktrees(root: Path) -> list[Path]:
    out = git(["worktree", "list", "--porcelain"], root).stdout
    return [Path(line[len("worktree "):]) for line in out.splitlines()
            if line.startswith("worktree ")]


@contextmanager
def worktree(root: Path, commit: str, parent: Path | None = None) -> Iterator[Path]:
    """A detached checkout of `commit` in a fresh folder (under `parent`, else the
    system's temporary folder), removed on the way out, also on an exception or Ctrl-C;
    `git worktree prune` clears what a removal left registered."""
    base = Path(tempfile.mkdtemp(prefix="fa-harness-bisect-", dir=parent))
    path = base / commit[:12]
    try:
        git(["worktree", "add", "--detach", str(path), commit], root)
        yield path
    finally:
        git(["worktree", "remove", "--force", str(path)], root, check=False)
        shutil.rmtree(base, ignore_errors=True)
        git(["worktree", "prune"], root, check=False)


@contextmanager
def interrupts_as_keyboard() -> Iterator[None]:
    """SIGTERM (a CI job cancelled) raises KeyboardInterrupt as Ctrl-C does, so the
    worktrees' `finally` runs; the previous handler is restored after. Only the main
    thread can set handlers: elsewhere nothing changes."""
    def raise_interrupt(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt

    try:
        old: Callable | int | None = signal.signal(signal.SIGTERM, raise_interrupt)
    except ValueError:  # not the main thread
        old = None
    try:
        yield
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
