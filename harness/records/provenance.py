"""Where a run came from: its commit, parent, branch and repository (git and the CI
system's variables) and its environment (Python, library versions, host), as a record
keeps them (harness.records.record)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any


def _git(args: Sequence[str], cwd: str | Path | None) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None  # no git binary, or it hung: the record simply has no git metadata
    return out.stdout.strip() or None if out.returncode == 0 else None


def git_metadata(cwd: str | Path | None = None) -> dict[str, Any]:
    """commit, parent, branch, dirty of the run, and the repository's web address when the
    CI system names it (GitHub: GITHUB_SERVER_URL/GITHUB_REPOSITORY; GitLab: CI_PROJECT_URL),
    so that a regression's commits can be linked.

    Explicit FA_HARNESS_COMMIT / _PARENT / _BRANCH win, then the CI system's variables
    (GitHub Actions, GitLab CI; shallow CI checkouts often cannot name the parent), then the
    working tree. Missing git is tolerated: the fields are then None."""
    env = os.environ
    commit = (env.get("FA_HARNESS_COMMIT") or env.get("GITHUB_SHA")
              or env.get("CI_COMMIT_SHA") or _git(["rev-parse", "HEAD"], cwd))
    branch = (env.get("FA_HARNESS_BRANCH") or env.get("GITHUB_HEAD_REF")
              or env.get("GITHUB_REF_NAME") or env.get("CI_MERGE_REQUEST_SOURCE_BRANCH_NAME")
              or env.get("CI_COMMIT_REF_NAME"))
    if not branch:
        b = _git(["rev-parse", "--abbrev-ref", "HEAD"], cwd)
        branch = None if b in (None, "HEAD") else b
    parent = env.get("FA_HARNESS_PARENT") or (
        _git(["rev-parse", f"{commit}^"], cwd) if commit else None)
    dirty = None
    if commit and not env.get("FA_HARNESS_COMMIT"):
        status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
        head = _git(["rev-parse", "HEAD"], cwd)
        dirty = bool(status) if head == commit else None
    server, repo = env.get("GITHUB_SERVER_URL"), env.get("GITHUB_REPOSITORY")
    url = (f"{server.rstrip('/')}/{repo.strip('/')}" if server and repo
           else env.get("CI_PROJECT_URL"))
    return {"commit": commit, "parent": parent, "branch": branch, "dirty": dirty,
            "repository_url": url or None}


def _dist_version(*names: str) -> str | None:
    # Package metadata, not an import: the CPU path must never import cupy.
    for name in names:
        try:
            return importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            continue
    return None


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": _dist_version("torch"),
        "cupy": _dist_version("cupy-cuda13x", "cupy-cuda12x", "cupy"),
        "numpy": _dist_version("numpy"),
        "harness": _dist_version("fa-harness"),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "argv": list(sys.argv[1:]),
    }
