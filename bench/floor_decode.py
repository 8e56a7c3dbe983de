"""The floor against an honest fast kernel: cuDNN's decode (sdpa_cudnn) timed on the decode
grid's longest cases, then judged as if it were a submission at that speed, and 2% faster.
It must never be `invalid` (only faster than the datasheet allows is); faster than the
runner's measured ceilings it is `suspicious`.

    python bench/floor_decode.py [--json FILE]

Measured ceilings: the runner's calibration when it has one, else the H200's measured copy
4,258 GB/s and fp16 matmul 713 TFLOP/s (bench notes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness.candidates.registry import get_candidate  # noqa: E402
from harness.core.buffers import OutputBuffers  # noqa: E402
from harness.core.cases import Case, MaskKind, make_inputs  # noqa: E402
from harness.core.iomodel import ideal_bytes  # noqa: E402
from harness.measure.timing import time_callable  # noqa: E402
from harness.submissions.floor import device_name, floors, judge, measured_ceilings  # noqa: E402
from harness.submissions.timed import ScoringOptions  # noqa: E402

H200_MEASURED = {"copy_gbps": 4258.0, "matmul_tflops": 713.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--kernel", default="sdpa_cudnn")
    args = ap.parse_args()
    gpu = device_name("cuda")
    opts = ScoringOptions()
    ceil, source = measured_ceilings(opts, "float16")
    if ceil is None:
        opts, source = ScoringOptions(ceilings=H200_MEASURED), "H200 measured (bench notes)"
    cand = get_candidate(args.kernel)
    out = []
    for nk in (131072, 65536, 32768):
        for kv in (8, 32):
            case = Case(1, 32, kv, 1, nk, 128, "float16", MaskKind.NONE)
            if cand.supports(case):
                continue
            inputs = make_inputs(case, "cuda")
            bufs = OutputBuffers.allocate(case, "cuda", cand.support.writes_lse)
            t = time_callable(lambda c=case, i=inputs, b=bufs: cand.run(c, i, b.out, b.lse))
            fl = floors(case, opts, gpu)
            ms = t.min_ms
            verdicts = {f"x{f:.2f}": judge(ms / f, fl, opts.floor_slack).verdict
                        for f in (1.0, 1.02, 1.05)}
            row = {"case": case.id, "kernel": args.kernel, "min_ms": ms,
                   "median_ms": t.median_ms, "gbps_at_min": ideal_bytes(case) / ms / 1e6,
                   "floors": fl.to_dict(), "ceilings_source": source, "verdicts": verdicts}
            out.append(row)
            print(f"{case.id}: {args.kernel} min {ms:.4f} ms ({row['gbps_at_min']:.0f} GB/s); "
                  f"physical floor {_ms(fl.physical_ms)} ({fl.gpu}), measured floor "
                  f"{_ms(fl.measured_ms)}; as a submission: {verdicts}")
            del inputs, bufs
            torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    bad = [r for r in out if "invalid" in (r["verdicts"]["x1.00"], r["verdicts"]["x1.02"])]
    print("honest cuDNN decode never invalid:", not bad)
    return 1 if bad else 0


def _ms(v: float | None) -> str:
    return "none" if v is None else f"{v:.4f} ms"


if __name__ == "__main__":
    sys.exit(main())
