"""DRAM bytes measured by Nsight Compute next to the IO model, for the naive kernel and
fa2_mma (and SDPA flash for reference), at N = 4096 and 16384, one head and 32 heads.

One head at N = 4096 fits the 60 MB L2 of an H200 (Q, K, V, O = 2 MiB at d = 64), which
hides most traffic; the 32-head N = 16384 shapes move 512 MiB of Q, K, V, O, many times
the L2, so measured bytes there are honest HBM traffic.

    python bench/ncu_bytes.py [--candidates naive,fa2_mma,sdpa_flash] [--out ncu_bytes.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CASES = ("b1h1-4096x4096-d64-fp16-none", "b1h1-16384x16384-d64-fp16-none",
         "b1h32-4096x4096-d128-fp16-none", "b1h32-16384x16384-d128-fp16-none")


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:10.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", default="naive,fa2_mma,sdpa_flash")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", default="ncu_bytes.json")
    args = ap.parse_args()

    from harness.candidates.registry import get_candidate
    from harness.core import iomodel
    from harness.core.cases import Case
    from harness.measure import ncu

    rows = []
    print(f"{'candidate':11} {'case':34} {'read MiB':>10} {'write MiB':>10} "
          f"{'model MiB':>10} {'ideal MiB':>10}  note")
    for name in args.candidates.split(","):
        cand = get_candidate(name.strip())
        for cid in args.cases.split(","):
            case = Case.from_id(cid.strip())
            model = iomodel.hbm_bytes(cand.algorithm, case, cand.tiles)
            ideal = iomodel.ideal_bytes(case)
            reason = cand.supports(case)
            m = ncu.NcuResult(error=f"skipped: {reason}") if reason else \
                ncu.measure_bytes(cand, case)
            rows.append({"candidate": cand.name, "case": case.id, "read": m.read_bytes,
                         "write": m.write_bytes, "time_ns": m.time_ns, "model": model,
                         "ideal": ideal, "kernels": m.kernels, "error": m.error})
            print(f"{cand.name:11} {case.id:34} {mib(m.read_bytes)} {mib(m.write_bytes)} "
                  f"{mib(model)} {mib(ideal)}  {m.error or ''}")
            if m.error and ("not found" in m.error or "ERR_NVGPUCTRPERM" in m.error):
                Path(args.out).write_text(json.dumps(rows, indent=2))
                return 2
    Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
