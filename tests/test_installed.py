"""fa-harness as a kernel team meets it: the wheel, installed (not editable) into a fresh
virtual environment, used from the team's own repository.

The repository (tests/data/user_repo, copied to a temporary folder) holds a
pyproject.toml naming its kernel folder and its Python candidate, the candidate module,
and one CUDA variant: a copy of the installed template under another name. From there,
with nothing of this checkout importable:

- `fa-harness kernels --json` lists both with their origin;
- `fa-harness kernels --compile` builds the team's variant with nvcc (when present);
- `fa-harness run` passes the Python candidate on the smoke grid;
- `pytest --pyargs harness.suites --fa-grid smoke` passes;
- `fa-harness submit team_fa` queues the variant, checked against the installed header.

One module-scoped fixture builds and installs once (torch comes from the CPU build on
disk: `pip install torch==2.13.0` finds it, never a CUDA build).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
USER_REPO = Path(__file__).parent / "data" / "user_repo"
# One worker runs the module: the others would only wait on the build's lock.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("installed")]


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 900
         ) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n" \
                                 f"{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin folder, user repository, environment) of a fresh venv holding the wheel.
    Built once per session: under pytest-xdist the workers share one build through a
    lock in the session's common temporary folder (pytest-xdist's documented recipe)."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's basetemp sits in the session's folder; alone, it is it.
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    done = shared / "installed.json"
    with FileLock(str(shared / "installed.lock")):
        if not done.exists():
            done.write_text(json.dumps([str(p) if isinstance(p, Path) else p
                                        for p in _build(tmp_path_factory)]))
    bin_, user, env = json.loads(done.read_text())
    return Path(bin_), Path(user), env


def _build(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("installed")
    # Build from a copy of the sources, so the build writes nothing into the checkout.
    src = tmp / "src"
    shutil.copytree(REPO / "harness", src / "harness",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    _ok(_run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
              "--no-build-isolation", "-w", str(tmp / "dist"), str(src)], tmp, env))
    (wheel,) = (tmp / "dist").glob("fa_harness-*.whl")
    venv.create(tmp / "venv", with_pip=True)
    bin_ = tmp / "venv" / "bin"
    _ok(_run([str(bin_ / "python"), "-m", "pip", "install", "-q", "torch==2.13.0"], tmp, env))
    _ok(_run([str(bin_ / "python"), "-m", "pip", "install", "-q", str(wheel)], tmp, env))

    user = tmp / "team_repo"
    shutil.copytree(USER_REPO, user)
    shipped = _ok(_run([str(bin_ / "python"), "-c",
                        "from harness.candidates.variants import KERNELS_ROOT; "
                        "print(KERNELS_ROOT)"], user, env)).stdout.strip()
    dst = user / "kernels" / "team_fa"
    shutil.copytree(Path(shipped) / "template", dst)
    man = dst / "manifest.toml"
    man.write_text(man.read_text().replace('name = "template"', 'name = "team_fa"'))
    env = {**env, "PATH": f"{bin_}{os.pathsep}{env.get('PATH', '')}",
           "FA_HARNESS_HOME": str(tmp / "home")}
    return bin_, user, env


def test_wheel_contents_and_installed_not_editable(installed):
    bin_, user, env = installed
    code = ("import harness, json, pathlib, importlib.util as u; "
            "from harness.candidates.variant_spec import header_path; "
            "print(json.dumps([harness.__file__, str(header_path()), "
            "u.find_spec('dashboard') is None, "
            "u.find_spec('harness.suites.test_correctness') is not None, "
            "u.find_spec('harness.dashboard.app') is not None]))")
    hfile, header, no_generic, suites, dash = json.loads(
        _ok(_run([str(bin_ / "python"), "-c", code], user, env)).stdout)
    site = str(bin_.parent / "lib")
    assert hfile.startswith(site) and header.startswith(site) and Path(header).is_file()
    assert no_generic and suites and dash
    assert (Path(header).parents[1] / "template" / "template.cu").is_file()


def test_kernels_json_lists_the_team_candidates_with_origin(installed):
    bin_, user, env = installed
    doc = json.loads(_ok(_run([str(bin_ / "fa-harness"), "kernels", "--json"], user,
                              env)).stdout)
    rows = {r["name"]: r for r in doc["candidates"]}
    project = f"pyproject.toml ({user / 'pyproject.toml'})"
    assert rows["team_fa"]["kind"] == "cuda"
    assert rows["team_fa"]["origin"] == \
        f"{project}: {user / 'kernels' / 'team_fa' / 'manifest.toml'}"
    assert rows["team_attn"]["kind"] == "python"
    assert rows["team_attn"]["origin"] == f"{project} team_attn:candidate"
    assert rows["template"]["origin"].startswith("shipped: " + str(bin_.parent / "lib"))
    assert doc["load_errors"] == []


def test_kernels_compile_builds_the_team_variant(installed):
    bin_, user, env = installed
    if shutil.which("nvcc", path=env["PATH"]) is None:
        pytest.skip("nvcc is not on PATH: the compile step is not run")
    doc = json.loads(_ok(_run([str(bin_ / "fa-harness"), "kernels", "--compile", "--arch",
                               "sm_80", "--json"], user, env)).stdout)
    team = [r for r in doc["compile"] if r["variant"] == "team_fa"]
    assert team and all(r["ok"] for r in team), team


def test_run_passes_the_python_candidate_on_the_smoke_grid(installed):
    bin_, user, env = installed
    out = user / "run.json"
    _ok(_run([str(bin_ / "fa-harness"), "run", "--kernels", "team_attn", "--no-progress",
              "--json", str(out)], user, env))
    doc = json.loads(out.read_text())
    rows = doc["results"] if isinstance(doc, dict) else doc
    assert len(rows) == 25 and {r["status"] for r in rows} == {"passed"}


def test_pytest_suites_from_the_team_repository(installed):
    bin_, user, env = installed
    proc = _ok(_run([str(bin_ / "python"), "-m", "pytest", "--pyargs", "harness.suites",
                     "--fa-grid", "smoke", "-q", "-p", "no:cacheprovider",
                     "--fa-kernels", "team_*"], user, env))
    last = proc.stdout.strip().splitlines()[-1]
    # The smoke grid's 25 cases: team_attn passes them on the CPU; team_fa (CUDA) and the
    # perf suite skip without a GPU.
    assert "25 passed" in last and "failed" not in last and "error" not in last, last
    assert "team_attn-b2h4-113x203-d64-fp16-none" not in proc.stdout  # nothing failed


@pytest.mark.skipif(shutil.which("bwrap") is None,
                    reason="bubblewrap not installed: submitted source is compiled only in "
                           "its sandbox (the refusal without it: tests/test_submit.py)")
def test_submit_queues_the_team_variant(installed):
    bin_, user, env = installed
    db = user / "queue.db"
    proc = _ok(_run([str(bin_ / "fa-harness"), "submit", "team_fa", "--db", str(db)], user,
                    env))
    assert proc.stdout.startswith("submission ") and "queued" in proc.stdout
    import sqlite3

    with sqlite3.connect(db) as con:
        (status, name), = con.execute("SELECT status, name FROM submissions").fetchall()
    assert status == "queued" and name == "team_fa"


def test_bad_input_from_the_installed_cli(installed):
    bin_, user, env = installed
    for argv, needle in ((["kernels", "--kernels-dir", "missing"], "no such folder"),
                         (["run", "--candidate", "team_attn:nope"], "has no attribute")):
        proc = _run([str(bin_ / "fa-harness"), *argv], user, env)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
