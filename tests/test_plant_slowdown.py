"""bench/plant_slowdown.py: the slowed copy for the gate's red test changes only the copy,
and every kernel of the chosen variant gets the guard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_plants_every_kernel_of_the_variant_in_a_copy_only(tmp_path):
    shipped = {p: p.read_text() for p in (ROOT / "harness/kernels/fa2_mma").glob("*.cu")}
    proc = subprocess.run([sys.executable, str(ROOT / "bench/plant_slowdown.py"), str(tmp_path),
                           "--variant", "fa2_mma", "--percent", "10"], text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert all(p.read_text() == t for p, t in shipped.items())  # shipped kernels untouched
    copy = (tmp_path / "harness/kernels/fa2_mma/fa2_mma.cu").read_text()
    assert "spent * 10 / 100" in copy
    assert copy.count("FaPlantedSlowdown fa_planted_slowdown_;") == \
        shipped[ROOT / "harness/kernels/fa2_mma/fa2_mma.cu"].count("__global__")
    # the copy is a complete package that loads the slowed variant under the same name
    code = ("from harness.candidates.registry import discover; "
            "import harness; print(harness.__file__); "
            "print([c.name for c in discover() if c.name == 'fa2_mma'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, text=True,
                         capture_output=True, timeout=120)
    assert str(tmp_path) in out.stdout and "['fa2_mma']" in out.stdout, out.stderr
    bad = subprocess.run([sys.executable, str(ROOT / "bench/plant_slowdown.py"), str(tmp_path),
                          "--variant", "nope"], text=True, capture_output=True, timeout=60)
    assert bad.returncode == 2 and "no variant 'nope'" in bad.stderr
