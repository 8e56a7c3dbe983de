"""`fa-harness bisect` on a GPU, the real path: a team's repository whose variant one
commit made 30% slower (bench/plant_slowdown.py's guard), each commit checked out in a
worktree, discovered from its pyproject, timed the gate's way in a child; the culprit is
that commit, and no worktree is left."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from benchscripts import load

from harness.candidates.discovery import KERNELS_ROOT
from harness.runs.bisect_run import BisectRequest, run_bisect

pytestmark = [pytest.mark.gpu, pytest.mark.exclusive]
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if shutil.which("git") is None:
    pytest.skip("needs git", allow_module_level=True)

KERNEL = "team_fa"
PLANTED_AT = 3


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_bisect_names_the_commit_that_planted_a_slowdown(tmp_path: Path):
    from harness.core.grids import get_grid

    plant = load("plant_slowdown").plant
    repo = tmp_path / "team"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "ci@example.com")
    git(repo, "config", "user.name", "ci")
    (repo / "pyproject.toml").write_text('[tool.fa-harness]\nkernels-dirs = ["kernels"]\n')
    dst = repo / "kernels" / KERNEL
    shutil.copytree(KERNELS_ROOT / "template", dst)
    man = dst / "manifest.toml"
    man.write_text(man.read_text().replace('name = "template"', f'name = "{KERNEL}"'))
    source = dst / "template.cu"
    commits = []
    for i in range(6):
        if i == PLANTED_AT:
            source.write_text(plant(source.read_text(), 30)[0])
        (repo / "notes.txt").write_text(f"change {i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"change {i}")
        commits.append(git(repo, "rev-parse", "HEAD"))
    cases = [c.id for c in get_grid("smoke") if c.dtype == "float16"][:6]
    lines: list[str] = []
    req = BisectRequest(repo=repo, good=commits[0], bad=commits[-1], kernel=KERNEL,
                        cases=",".join(cases), db_url=str(tmp_path / "r.sqlite"),
                        max_minutes=8.0)
    out = run_bisect(req, log=lines.append)
    text = "\n".join(lines + out.lines())
    assert out.result.culprit == commits[PLANTED_AT], text
    assert out.result.step is not None and out.result.step > 1.1, text
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    print(text)
