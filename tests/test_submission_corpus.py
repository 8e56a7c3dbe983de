"""The submission corpus (tests/data/submissions) is what the GPU tests and the H200 runs
judge: these CPU tests make sure it holds the bugs it claims to hold.

- The committed .cu files are exactly what generate.py writes (no hand edit drifts).
- The planted shared-memory race survives compilation. A race the compiler folds away
  (a flag stored once in shared memory and read back is replaced by its constant) is no
  race at all: racecheck then rightly reports 0 hazards and the output never varies. The
  PTX must hold the shared stores and loads, with a single barrier (the one before a
  tile is overwritten), so the reads of a tile are unordered with its stores.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import harness

DATA = Path(__file__).parent / "data" / "submissions"
INCLUDE = Path(harness.__file__).parent / "kernels" / "include"


def test_committed_corpus_is_what_generate_writes(tmp_path):
    copy = tmp_path / "submissions"
    shutil.copytree(DATA, copy)
    subprocess.run([sys.executable, str(copy / "generate.py")], check=True, timeout=60)
    changed = [p.name for p in sorted(copy.glob("*.cu"))
               if p.read_text() != (DATA / p.name).read_text()]
    assert changed == [], f"run tests/data/submissions/generate.py: {changed} differ"


def _ptx(name: str, tmp_path: Path) -> str:
    out = tmp_path / (name + ".ptx")
    subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-I", str(INCLUDE), "-x", "cu",
                    "-o", str(out), str(DATA / f"{name}.cu")], check=True, timeout=120,
                   capture_output=True)
    return out.read_text()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_the_planted_race_survives_into_ptx(tmp_path):
    ptx = _ptx("racy_rows", tmp_path)
    assert re.search(r"\bst\.shared\.u16\b", ptx), "no shared store: the race was folded away"
    assert re.search(r"\bld\.shared\.u16\b", ptx), "no shared load: the race was folded away"
    # One barrier only (before a tile is overwritten): none between stores and reads.
    assert len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b", ptx)) == 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_the_honest_kernel_uses_no_shared_memory(tmp_path):
    # The race check's control: the kernel racy_rows derives from has nothing to race on.
    ptx = _ptx("good_rowwarp", tmp_path)
    assert not re.search(r"\b(st|ld)\.shared\b", ptx)
