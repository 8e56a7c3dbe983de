"""The CI templates a team copies (ci/user-repo/) and the README's install line: the
install forms they give work, they cache the compile-cache folder under a key that moves
with the sources, and they say what the code does (the SQLite default, the exit codes)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = sorted((REPO / "ci" / "user-repo").glob("*.yml"))


def test_the_templates_say_what_the_code_does(tmp_path, monkeypatch):
    from harness.records.db.engine import default_db_path

    monkeypatch.delenv("FA_HARNESS_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    said = "~/.local/share/fa-harness/results.sqlite"
    assert str(default_db_path()) == said.replace("~", str(tmp_path))
    assert len(TEMPLATES) == 2
    for t in TEMPLATES:
        text = t.read_text()
        assert "~/.fa-harness" not in text and said in text, t.name
        assert "ci --require-gpu" in text, t.name  # a GPU-less runner fails at once
        assert "FA_HARNESS_CACHE" in text and "3 when" in text, t.name
        # not `"fa-harness[gpu,postgres]"` alone: fa-harness is on no package registry
        assert not re.search(r"[\"' ]fa-harness\[[a-z,]+\][\"']", text), t.name


def test_the_github_template_keys_its_cache_on_the_sources(tmp_path, monkeypatch, capsys):
    from harness.candidates import registry
    from harness.candidates.cache_key import cache_key
    from harness.cli import main as cli_main

    text = (REPO / "ci" / "user-repo" / "github-actions.yml").read_text()
    assert "fa-harness kernels --cache-key" in text and "actions/cache@v4" in text
    assert "path: ${{ env.FA_HARNESS_CACHE }}" in text
    monkeypatch.chdir(tmp_path)
    registry.clear_cache()
    assert cli_main(["kernels", "--cache-key"]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("fa-harness-") and key == cache_key(registry.discover())
    # a changed source moves the key
    cand = next(c for c in registry.discover() if c.name == "template")
    monkeypatch.setattr(type(cand.spec), "source_hash", property(lambda _s: "changed"))
    assert cache_key(registry.discover()) != key
    registry.clear_cache()


@pytest.mark.slow
def test_the_documented_install_forms_work(tmp_path):
    """The pinned forms the README and the templates give: a git URL at a commit and a
    checkout's path, both with the extras (dependencies are the registry's business, not
    what is checked here: --no-deps)."""
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
    clone = tmp_path / "fa-harness"
    subprocess.run(["git", "clone", "-q", "--no-local", str(REPO), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # (a file:// URL with a host: pip before 23.3 refuses an empty one in a PEP 508 URL)
    for n, spec in enumerate((f"fa-harness[gpu,postgres] @ git+file://localhost{clone}@{head}",
                              f"{clone}[gpu,postgres]")):
        target = tmp_path / f"site{n}"
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                               "--no-build-isolation", "--target", str(target), spec],
                              capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (target / "harness" / "kernels" / "fa2_mma" / "fa2_mma.cu").is_file()
        assert list(target.glob("fa_harness-*.dist-info"))
