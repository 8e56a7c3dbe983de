"""The CI gate's prepare phase on a GPU: the sanitizer tier fails a kernel that writes
far past its output (a kernel the full grid passes: the address was mapped), and the
warm-up fills the compile caches that a later process loads (GPU only)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from harness.cli import main as cli_main

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

DATA = Path(__file__).parent / "data" / "submissions"


def test_the_sanitizer_tier_fails_a_far_writer_the_correctness_grid_passes(tmp_path,
                                                                           capsys):
    from harness.execution.sanitize import sanitizer_path

    if sanitizer_path() is None:
        pytest.skip("compute-sanitizer not installed")
    kdir = tmp_path / "kernels"
    kdir.mkdir()
    shutil.copy(DATA / "far_writer.cu", kdir / "far_writer.cu")
    rc = cli_main(["ci", "--kernels-dir", str(kdir), "--kernels", "far_writer",
                   "--grid", "smoke", "--db", str(tmp_path / "ci.sqlite"),
                   "--summary", str(tmp_path / "s.md")])
    out = capsys.readouterr().out
    summary = (tmp_path / "s.md").read_text()
    assert rc == 1, out[-3000:]
    assert summary.startswith("## fa-harness CI: FAILED (1 sanitizer finding(s)")
    line = next(ln for ln in summary.splitlines() if ln.startswith("- FAILED sanitize"))
    assert "far_writer: memcheck:" in line and "Invalid __global__ write" in line, line


def test_the_warm_up_fills_the_caches_a_later_process_loads(tmp_path, monkeypatch):
    from harness.candidates import registry
    from harness.core.grids import get_grid
    from harness.execution.warmup import WarmTask, warm_up

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "cupy"))
    names = {c.name: c for c in registry.discover()}
    tasks = [WarmTask("fa2_mma", get_grid("smoke")[:1], "compile")]
    if registry.unavailable_reason(names["triton_fa2"]) is None:
        tasks.append(WarmTask("triton_fa2", get_grid("perf")[:2], "timing"))
    results = warm_up(tasks, parallel=2)
    assert all(r.ok for r in results), [r.failures for r in results]
    assert any((tmp_path / "cupy").rglob("*")), "NVRTC's cubin was not cached"
    if len(tasks) > 1:
        assert any((tmp_path / "triton").rglob("*.cubin")), "Triton's kernels not cached"
