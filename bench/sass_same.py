"""Is a kernel's source change a change of its machine code? The SASS of every entry of a
CUDA variant (and of each of its [[flavor]]s) at two revisions, compared instruction by
instruction with the addresses left out, and the registers of each; no GPU needed (nvcc
and cuobjdump, as `fa-harness kernels --compile` uses them).

    python bench/sass_same.py 2045e0e                      # that revision against the tree
    python bench/sass_same.py 2045e0e HEAD --variant harness/kernels/fa3_wgmma
    python bench/sass_same.py HEAD --arch sm_80 --variant harness/kernels/fa2_mma

An entry whose SASS is the same at both revisions is the same kernel, whatever its
source looks like, so what was measured of it at one revision (its time, its full grid,
the sanitizer) holds at the other. Exit 0 when every entry is the same, 1 when one
differs or exists at one revision only, 2 on bad input (an unknown revision, a folder
that is no variant there, a failed compile).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.candidates.nvcc import arch_for, cached_nvcc  # noqa: E402
from harness.candidates.sass import sass_by_function  # noqa: E402
from harness.candidates.variants import load_variant  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gitrev import files_at, write_at  # noqa: E402

_ADDR = re.compile(r"/\*[0-9a-f]{4,}\*/")


def _folder_at(rev: str, variant: str, into: Path) -> Path:
    """The variant folder as it is at `rev` ("." for the working tree)."""
    if rev == ".":
        return ROOT / variant
    names = files_at(rev, variant)
    if not names:
        raise ValueError(f"{variant} holds no files at {rev}")
    out = into / rev.replace("/", "_") / Path(variant).name
    write_at(rev, variant, names, out)
    return out


def entries_at(rev: str, variant: str, target: str, into: Path
               ) -> dict[str, tuple[list[str], int | None]]:
    """{entry: (its SASS lines without addresses, registers)} of every build of the
    variant (itself and its flavors) at `rev`."""
    out: dict[str, tuple[list[str], int | None]] = {}
    for spec in load_variant(_folder_at(rev, variant, into)).with_flavors():
        arch = arch_for(spec, target)
        if arch is None:
            continue
        res = cached_nvcc(spec.full_source(), spec.compile_options, 600, arch=arch,
                          filename=f"{spec.name}.cu")
        if not res.ok or res.cubin is None:
            raise ValueError(f"{spec.name} at {rev} does not compile:\n{res.message[-2000:]}")
        for name, sass in sass_by_function(res.cubin).items():
            # Every line, the second encoding word of each instruction too: it holds the
            # scheduling (stall counts, dependency barriers), which the text does not.
            code = [_ADDR.sub("", line).strip() for line in sass.splitlines() if line.strip()]
            regs = res.resources.get(name)
            out[f"{spec.name}:{name}"] = (code, regs.registers if regs else None)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="a git revision")
    ap.add_argument("rev2", nargs="?", default=".",
                    help="another revision (default: the working tree)")
    ap.add_argument("--variant", default="harness/kernels/fa3_wgmma",
                    help="the variant folder, relative to the repository")
    ap.add_argument("--arch", default="sm_90", help="the GPU to build for (default sm_90)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sass-same-") as tmp:
        try:
            a = entries_at(args.rev, args.variant, args.arch, Path(tmp))
            b = entries_at(args.rev2, args.variant, args.arch, Path(tmp))
        except (ValueError, subprocess.CalledProcessError, RuntimeError) as e:
            detail = getattr(e, "stderr", None) or str(e)
            print(f"sass_same: {detail if isinstance(detail, str) else detail.decode()}"
                  .strip(), file=sys.stderr)
            return 2
    width = max(map(len, a | b))
    print(f"{'entry':{width}}  SASS       instructions  registers  ({args.rev} / {args.rev2})")
    differ = 0
    for name in sorted(a | b):
        (ca, ra), (cb, rb) = a.get(name, ([], None)), b.get(name, ([], None))
        same = name in a and name in b and ca == cb
        differ += not same
        verdict = "same" if same else "missing" if not (name in a and name in b) else "different"
        na, nb = (sum(1 for line in c if line.endswith("*/") and ";" in line) for c in (ca, cb))
        print(f"{name:{width}}  {verdict:9}  {na:5} / {nb:<5}  {ra} / {rb}")
    print(f"{len(a | b) - differ} of {len(a | b)} entries the same")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
