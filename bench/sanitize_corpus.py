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
from harness.execution import sanitize  # noqa: E402

DATA = ROOT / "tests" / "data" / "submissions"
DEFAULT = ["good_rowwarp.cu", "racy_rows.cu", "far_writer.cu"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=DEFAULT)
    ap.add_argument("--json")
    ap.add_argument("--with-fa2", action="store_true", help="also the shipped fa2_mma")
    ap.add_argument("--tools", default=",".join(sanitize.TOOLS),
                    help="comma-separated tools (default: all four)")
    ap.add_argument("--racecheck-report", default=sanitize.RACECHECK_REPORT,
                    choices=["all", "analysis", "hazard"])
    ap.add_argument("--timeout", type=float, default=sanitize.DEFAULT_TIMEOUT_S,
                    help="seconds per tool run")
    ap.add_argument("--parallel", action="store_true",
                    help="the kernels at the same time (one thread each)")
    args = ap.parse_args()
    sanitize.RACECHECK_REPORT = args.racecheck_report
    tools = tuple(t.strip() for t in args.tools.split(",") if t.strip())
    print(f"compute-sanitizer: {sanitize.sanitizer_path()}; tools {', '.join(tools)}; "
          f"racecheck report {args.racecheck_report}; timeout {args.timeout:g} s")
    paths = [DATA / n for n in args.names]
    if args.with_fa2:
        paths.append(ROOT / "harness" / "kernels" / "fa2_mma")
    out = []

    def one(path: Path) -> dict:
        cand = CudaVariant.from_spec(load_variant(path))
        t0 = time.monotonic()
        rep = sanitize.sanitize(str(path), cand.support, sanitize.source_names(cand),
                                tools=tools, timeout_s=args.timeout)
        lines = [f"{path.name}: {rep.status} in {time.monotonic() - t0:.1f} s, cases "
                 f"{', '.join(rep.cases)}"]
        lines += [f"    {t.tool:<10} {t.status:<9} {t.wall_s:5.1f} s  {t.summary[:160]}"
                  for t in rep.tools]
        print("\n".join(lines), flush=True)
        return {"name": path.name, "racecheck_report": args.racecheck_report, **rep.to_dict(),
                "raw": {t.tool: t.raw for t in rep.tools}}

    if args.parallel:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(paths)) as pool:
            out = list(pool.map(one, paths))
    else:
        for path in paths:
            out.append(one(path))
            if args.json:
                Path(args.json).write_text(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
