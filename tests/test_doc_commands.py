"""Every shell command the documentation gives (README.md and docs/*.md) runs as written.

The fenced blocks marked ```sh, ```bash, ```shell or ```console are read: in a console
block the lines after `$ ` are the commands (the rest is their output; `echo $?` shows the
exit code and is not run), in the others every line that is not a comment. Each command is
either run here, on the CPU, in a temporary directory with its own results database and
`FA_HARNESS_HOME`, and must exit with the code the documentation gives (`RUN`), or listed
in `SKIP` with the reason it cannot run here (a GPU, a server, a placeholder). A command
in neither list fails the test: a new command in the docs is either run or said why not.
Commands that name the project's records (`results/...`) find them through a link to the
checkout's `results/` in the temporary directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"sh", "bash", "shell", "console"}

_A = "results/h200-20261202T142356Z-perf.json"
_B = "results/h200-20261204T193325Z-perf.json"

# Run on the CPU, with the exit code the documentation gives.
RUN: dict[str, int] = {
    # README.md
    "fa-harness kernels": 0,
    "fa-harness ci --require-gpu": 3,  # no working GPU here: "not measured", one line
    # docs/commands.md
    "fa-harness run --kernels bug_causal_off_by_one --no-store": 1,
    "pytest --pyargs harness.suites --fa-grid smoke --fa-kernels 'fa2*'": 0,
    # docs/kernels.md
    "fa-harness kernels --cache-key": 0,
    "fa-harness run --kernels fa2_model": 0,
    # docs/judging.md
    "fa-harness run --grid smoke --backward --kernels fa2_model --cases '*-113x203-*'": 0,
    "fa-harness iomodel --seq-len 4096 --head-dim 64 --block-q 64 --gpu h100-sxm": 0,
    # docs/measuring.md
    "fa-harness calibrate": 2,  # no GPU: one line, exit 2
    "pytest --pyargs harness.suites.test_perf --fa-kernels 'fa2*,sdpa_flash' "
    "--benchmark-json perf.json": 0,  # the perf suite skips without a GPU
    # docs/database-and-ci.md, in this order (export needs the imported runs)
    "fa-harness db upgrade": 0,
    "fa-harness db current": 0,
    f"fa-harness import --trusted {_A} {_B}": 0,
    "fa-harness export --run latest -o run.json": 0,
    f"fa-harness compare {_A} {_B}": 1,  # regressions and missing entries between the two
    "fa-harness ci": 3,  # nothing of a team's here: one line, exit 3
}

# Listed in the documentation, not run here, and why.
SKIP: dict[str, str] = {
    "make run": "creates .venv in the checkout and runs every candidate (about a minute "
                "on 2 cores); what it runs is `fa-harness run`, whose output the README "
                "shows and whose quick forms run here",
    "make test": "the whole test suite, CI itself (about 10 minutes)",
    'pip install "fa-harness[gpu,postgres] @ git+https://<host>/<org>/fa-harness.git'
    '@<tag-or-commit>"': "placeholders for a host and a tag; tests/test_templates.py "
                         "installs this form from a clone",
    "git submodule add <fa-harness repository URL> third_party/fa-harness":
        "placeholder URL, and it changes a git repository",
    'pip install "./third_party/fa-harness[gpu,postgres]"':
        "needs the submodule above; tests/test_templates.py installs a checkout",
    "python3 -m pip wheel --no-deps -w wheels /path/to/fa-harness": "placeholder path",
    'pip install "wheels/fa_harness-0.1.0-py3-none-any.whl[gpu,postgres]"':
        "needs the wheel above; tests/test_installed.py builds and installs one",
    "fa-harness kernels --compile": "nvcc builds of every CUDA variant (needs the CUDA "
                                    "toolkit; over a minute); make test runs it",
    "fa-harness submit my_variant": "needs the team's variant `my_variant` (placeholder)",
    "fa-harness run --grid perf-bwd --kernels 'fa2_mma,triton_fa2,sdpa_*'": "needs a GPU",
    "fa-harness run --grid perf --baseline sdpa_flash --ncu": "needs a GPU and Nsight "
                                                              "Compute",
    "fa-harness import --trusted results/": "the whole committed history (about a minute "
                                            "on 2 cores); the same command on two "
                                            "records runs here (docs/database-and-ci.md)",
    "fa-harness dashboard [--db URL] [--port 8501]": "a server that runs until stopped "
                                                     "(tests/test_dashboard*.py start it)",
    "fa-harness token create --name alice": "writes a submission token to a shared "
                                            "database (tests/test_submissions*.py)",
    "fa-harness token revoke alice": "needs the token above (tests/test_submissions*.py)",
    "fa-harness submit my_variant/ --token fah_...": "placeholder variant and token",
    "fa-harness worker --gpu 0": "needs a GPU",
    "fa-harness worker --gpu all --db postgresql://...": "needs GPUs and a PostgreSQL "
                                                         "server",
    "fa-harness leaderboard [--json] [--all] [--pass fwd|bwd|both]":
        "option syntax, not a command line (tests/test_leaderboard*.py)",
}


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a `#` after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def doc_blocks() -> list[tuple[str, int, list[str]]]:
    """(doc path relative to the repository, block number, commands) for every shell block."""
    out = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        i, n = 0, 0
        while i < len(lines):
            m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
            if not m:
                i += 1
                continue
            indent, lang = len(m.group(1)), m.group(2)
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            body = [x[indent:] if x[:indent].isspace() else x.lstrip() for x in lines[i + 1:j]]
            i = j + 1
            if lang not in SHELL_LANGS:
                continue
            n += 1
            cmds = []
            for line in body:
                if lang == "console":
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                cmd = _strip_comment(line.strip())
                if cmd and cmd != "echo $?":
                    cmds.append(cmd)
            out.append((str(doc.relative_to(ROOT)), n, cmds))
    return out


BLOCKS = doc_blocks()


def _runnable_blocks() -> list[tuple[str, int, list[str]]]:
    """Each block's commands to run here: a command given in several blocks runs in the
    first only (a block's commands run in its order, in one directory and database)."""
    seen: set[str] = set()
    out = []
    for doc, n, cmds in BLOCKS:
        todo = [c for c in cmds if c in RUN and c not in seen]
        seen.update(todo)
        if todo:
            out.append((doc, n, todo))
    return out


def test_every_documented_command_is_run_or_skipped_with_a_reason() -> None:
    found = [c for _, _, cmds in BLOCKS for c in cmds]
    assert found, "no shell block found in the documentation"
    unknown = sorted({c for c in found if c not in RUN and c not in SKIP})
    assert not unknown, ("commands in the docs neither run nor skipped by "
                         f"tests/test_doc_commands.py: {unknown}")
    stale = sorted((set(RUN) | set(SKIP)) - set(found))
    assert not stale, f"commands listed here that no doc gives any more: {stale}"
    assert not set(RUN) & set(SKIP)


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "FA_HARNESS_")) and k != "COV_CORE_SOURCE"}
    env.update(FA_HARNESS_DB=str(tmp / "results.sqlite"), FA_HARNESS_HOME=str(tmp / "home"),
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
               COLUMNS="100", CUDA_VISIBLE_DEVICES="")
    return env


@pytest.mark.parametrize(
    "doc,n,cmds", [pytest.param(d, n, c, id=f"{d}#{n}") for d, n, c in _runnable_blocks()])
def test_documented_commands_run(doc: str, n: int, cmds: list[str], tmp_path: Path) -> None:
    """A block's runnable commands, in its order, in one temporary directory and database."""
    (tmp_path / "results").symlink_to(ROOT / "results")
    env = _env(tmp_path)
    for cmd in cmds:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == RUN[cmd], (
            f"{doc}: `{cmd}` exited {proc.returncode}, the docs say {RUN[cmd]}\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
