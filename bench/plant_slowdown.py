"""Make a copy of the harness package in which one shipped variant runs ~10% longer, to
prove that `fa-harness ci` catches a slowdown and names the variant.

    python bench/plant_slowdown.py DEST [--variant fa2_mma] [--percent 10]
    PYTHONPATH=DEST python -m harness ci ...        # the slowed copy, same names

The shipped kernels are not touched: DEST/harness is a copy, and only the copy's sources of
the chosen variant get a guard object at the top of every `__global__` function whose
destructor spins on clock64() for `percent`% of the time the thread already spent. Every
thread, so every CTA, so the whole launch takes that much longer whatever the kernel does.
The variant keeps its name (the gate compares by name); its source hash changes.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = '#include "fa_harness.h"'
GUARD = """
#ifndef FA_PLANTED_SLOWDOWN
#define FA_PLANTED_SLOWDOWN
// Planted by bench/plant_slowdown.py (a test copy, never shipped): each thread spins for
// PERCENT% of its own elapsed clock before it leaves the kernel.
struct FaPlantedSlowdown {
    long long t0;
    __device__ FaPlantedSlowdown() : t0(clock64()) {}
    __device__ ~FaPlantedSlowdown() {
        long long spent = clock64() - t0;
        long long until = clock64() + spent * PERCENT / 100;
        while (clock64() < until) {
        }
    }
};
#endif
"""
# The opening brace of a kernel: `__global__ ... name(...)` up to its first `{`.
KERNEL_RE = re.compile(r"(__global__[^;{]*?\)\s*\{)", re.S)


def plant(source: str, percent: int) -> tuple[str, int]:
    if INCLUDE not in source:
        raise ValueError(f"no {INCLUDE} line to put the guard after")
    guard = GUARD.replace("PERCENT", str(int(percent)))
    text = source.replace(INCLUDE, INCLUDE + "\n" + guard, 1)
    text, n = KERNEL_RE.subn(r"\1 FaPlantedSlowdown fa_planted_slowdown_;", text)
    return text, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--variant", default="fa2_mma")
    ap.add_argument("--percent", type=int, default=10)
    args = ap.parse_args(argv)
    src_pkg = ROOT / "harness"
    folder = src_pkg / "kernels" / args.variant
    if not (folder / "manifest.toml").is_file():
        print(f"plant_slowdown: no variant {args.variant!r} under {src_pkg / 'kernels'}",
              file=sys.stderr)
        return 2
    dest_pkg = args.dest / "harness"
    if dest_pkg.exists():
        shutil.rmtree(dest_pkg)
    shutil.copytree(src_pkg, dest_pkg, ignore=shutil.ignore_patterns("__pycache__"))
    total = 0
    for cu in sorted((dest_pkg / "kernels" / args.variant).glob("*.cu")):
        text, n = plant(cu.read_text(), args.percent)
        cu.write_text(text)
        total += n
    if total == 0:
        print(f"plant_slowdown: no __global__ function found in {folder}", file=sys.stderr)
        return 1
    print(f"{dest_pkg}: {args.variant} slowed by {args.percent}% in {total} kernel(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
