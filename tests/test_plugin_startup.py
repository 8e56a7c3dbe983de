"""The pytest plugin is loaded by every pytest session in an environment that has
fa-harness: an unrelated session must not pay for torch or candidate discovery, and the
discovery options must fail in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

UNRELATED = '''
import sys

def test_nothing_heavy_was_imported():
    heavy = [m for m in ("torch", "harness.candidates.registry", "harness.core.cases")
             if m in sys.modules]
    assert heavy == [], heavy
    assert "harness.pytest_plugin" in sys.modules  # the plugin itself is loaded
'''


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_an_unrelated_session_imports_nothing_heavy(tmp_path):
    (tmp_path / "test_unrelated.py").write_text(UNRELATED)
    proc = _pytest(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_missing_kernels_dir_is_one_usage_line(tmp_path):
    proc = _pytest(tmp_path, "--pyargs", "harness.suites", "--fa-kernels-dir", "nope")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert "--fa-kernels-dir nope: no such folder" in err and "Traceback" not in err


def test_a_missing_candidate_module_is_one_usage_line(tmp_path):
    proc = _pytest(tmp_path, "--pyargs", "harness.suites", "--fa-candidate", "nosuch_x:c")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "--fa-candidate nosuch_x:c: no module named 'nosuch_x'" in proc.stderr


def test_the_shipped_suites_from_a_team_repository_warn_of_no_unknown_mark(tmp_path):
    """`pytest --pyargs harness.suites` from a repository whose own ini knows nothing of
    fa-harness: the plugin registers the `gpu` mark the suites use."""
    proc = _pytest(tmp_path, "--pyargs", "harness.suites", "--fa-grid", "smoke",
                   "--fa-kernels", "naive_model", "-W", "error::pytest.PytestUnknownMarkWarning")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Unknown pytest.mark" not in proc.stdout + proc.stderr
