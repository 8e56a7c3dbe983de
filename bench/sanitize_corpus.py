"""compute-sanitizer on a few submissions and a shipped kernel, directly (no queue): each
tool's verdict, one-line summary and wall time, and the raw reports (to check the parser
against what the tool really prints).

    python bench/sanitize_corpus.py [--json FILE] [NAME.cu ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.candidates.cuda_candidate import CudaVariant  # noqa: E402
from harness.candidates.variants import load_variant  # noqa: E402
from harness.submissions import sanitize  # noqa: E402

DATA = ROOT / "tests" / "data" / "submissions"
DEFAULT = ["good_rowwarp.cu", "racy_rows.cu", "far_writer.cu"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=DEFAULT)
    ap.add_argument("--json")
    ap.add_argument("--with-fa2", action="store_true", help="also the shipped fa2_mma")
    args = ap.parse_args()
    print(f"compute-sanitizer: {sanitize.sanitizer_path()}")
    paths = [DATA / n for n in args.names]
    if args.with_fa2:
        paths.append(ROOT / "harness" / "kernels" / "fa2_mma")
    out = []
    for path in paths:
        cand = CudaVariant.from_spec(load_variant(path))
        t0 = time.monotonic()
        rep = sanitize.sanitize(str(path), cand.support, sanitize.source_names(cand))
        entry = {"name": path.name, **rep.to_dict(),
                 "raw": {t.tool: t.raw for t in rep.tools}}
        out.append(entry)
        print(f"{path.name}: {rep.status} in {time.monotonic() - t0:.1f} s, cases "
              f"{', '.join(rep.cases)}")
        for t in rep.tools:
            print(f"    {t.tool:<10} {t.status:<9} {t.wall_s:5.1f} s  {t.summary[:160]}")
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
