"""A folder of the repository as it was at a git revision, written out: what
bench/sass_same.py compiles and bench/ab_prepare.py renames."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> bytes:
    """git's output in the repository; raises CalledProcessError (with stderr) on failure."""
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True,
                          capture_output=True).stdout


def files_at(rev: str, folder: str) -> list[str]:
    """The repository paths of the files under `folder` at `rev` (none: an empty list)."""
    return [f for f in git("ls-tree", "-r", "--name-only", rev, "--", folder.strip("/") + "/")
            .decode().splitlines() if f]


def write_at(rev: str, folder: str, files: list[str], dest: Path) -> None:
    """Each of `files` (under `folder`) as it is at `rev`, byte for byte, to the same place
    under `dest`."""
    for f in files:
        out = dest / Path(f).relative_to(folder.strip("/"))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(git("show", f"{rev}:{f}"))
