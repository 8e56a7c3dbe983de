"""A kernel variant as it was at a git revision, renamed, in a kernels folder of its own:
the baseline of an A/B run against the working tree's variant.

    python bench/ab_prepare.py 40c16b2 --variant harness/kernels/fa3_wgmma --as fa3_base
    FA_HARNESS_KERNELS=$PWD/ab python bench/ab_interleaved.py \\
        --kernels fa3_base,fa3_wgmma,sdpa_cudnn --cases '*-d128-*'

The GPU machine gets the tree without `.git`, so the old variant is written out here, on
the machine that has the history, and travels with the tree (`ab/` is ignored by git; the
device tool's `carry` takes it). Every file of the variant's folder at REV is written to
OUT/NAME/, byte for byte, except the manifest's `name` (NAME) and its flavors' names
(NAME + their suffix), so that both versions load side by side; the copy is then loaded
as the harness loads any variant, and a file SOURCE.txt in it names the revision and
its commit. Run it again with the same NAME to replace the copy.

Exit status: 0 written; 2 on bad input (a revision git does not know, a folder that is no
variant at that revision, a NAME that is not an identifier or is the variant's own name).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _renamed(manifest: str, old: str, new: str) -> str:
    """The manifest with `name = "old"` and each `name = "old_suffix"` (the flavors')
    renamed; nothing else is touched."""
    pattern = re.compile(r'^(\s*name\s*=\s*)"' + re.escape(old) + r'(_[A-Za-z0-9_]*)?"',
                         re.M)
    return pattern.sub(lambda m: f'{m.group(1)}"{new}{m.group(2) or ""}"', manifest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="a git revision (commit, tag, branch)")
    ap.add_argument("--variant", required=True,
                    help="the variant's folder, relative to the repository root")
    ap.add_argument("--as", dest="name", required=True, help="the copy's variant name")
    ap.add_argument("--out", default="ab", help="the kernels folder to write into")
    args = ap.parse_args(argv)

    from gitrev import files_at, git, write_at

    from harness.candidates.variants import VariantError, load_variant_dir

    folder = args.variant.strip("/")
    if not IDENT.match(args.name):
        print(f"error: --as {args.name!r} is not an identifier", file=sys.stderr)
        return 2
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{args.rev}^{{commit}}").decode().strip()
    except subprocess.CalledProcessError:
        print(f"error: git knows no revision {args.rev!r}", file=sys.stderr)
        return 2
    files = files_at(commit, folder)
    if f"{folder}/manifest.toml" not in files:
        print(f"error: {folder} holds no manifest.toml at {args.rev}", file=sys.stderr)
        return 2
    old_name = Path(folder).name
    if args.name == old_name:
        print(f"error: --as must differ from the variant's own name {old_name!r}",
              file=sys.stderr)
        return 2

    out = Path(args.out)
    target = out / args.name
    with tempfile.TemporaryDirectory(dir=out if out.is_dir() else None) as tmp:
        staged = Path(tmp) / args.name
        write_at(commit, folder, files, staged)
        manifest = staged / "manifest.toml"
        manifest.write_text(_renamed(manifest.read_text(), old_name, args.name))
        (staged / "SOURCE.txt").write_text(
            f"{folder} at {args.rev} (commit {commit}), renamed {args.name}\n")
        try:
            spec = load_variant_dir(staged)
        except VariantError as e:
            print(f"error: the copy does not load as a variant: {e}", file=sys.stderr)
            return 2
        out.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        shutil.move(str(staged), target)
    flavors = ", ".join(f.name for f in spec.flavors)
    print(f"{target}: {folder} at {commit[:12]} as {spec.name}"
          + (f" (flavors: {flavors})" if flavors else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
