"""How repeatable is one measurement? Ten measurements of the same ~1 ms call (SDPA
flash, b4h16-4096x4096-d64 fp16 on an H200) in one run: the coefficient of variation of
their medians (target <= 0.5%), and the median of those medians against
triton.testing.do_bench's median of the same call (target within 2%).

    python bench/timing_noise.py [--candidate sdpa_flash] [--case ID] [--repeats 10]
                                 [--out timing_noise.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

CASE = "b4h16-4096x4096-d64-fp16-none"


def cv(xs: list[float]) -> float:
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidate", default="sdpa_flash")
    ap.add_argument("--case", default=CASE)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default="timing_noise.json")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("timing_noise: needs a CUDA GPU", file=sys.stderr)
        return 2
    from harness.candidates.registry import get_candidate
    from harness.core.cases import Case, make_inputs
    from harness.measure.perf import make_launch, output_buffers
    from harness.measure.timing import measure

    case = Case.from_id(args.case)
    cand = get_candidate(args.candidate)
    inputs = make_inputs(case, "cuda")
    out, lse = output_buffers(cand, case)
    launch = make_launch(cand, case, [inputs], out, lse)

    ours = []
    method = ""
    for _ in range(args.repeats):
        t = measure(launch)
        ours.append(t.median_ms)
        method = t.method
    result = {"candidate": cand.name, "case": case.id, "gpu": torch.cuda.get_device_name(),
              "harness_medians_ms": ours, "harness_cv": cv(ours),
              "harness_median_of_medians_ms": statistics.median(ours), "method": method}
    try:
        from triton.testing import do_bench

        theirs = [do_bench(lambda: launch(0), return_mode="median")
                  for _ in range(args.repeats)]
        result |= {"do_bench_medians_ms": theirs, "do_bench_cv": cv(theirs),
                   "do_bench_median_of_medians_ms": statistics.median(theirs)}
        result["ratio_harness_over_do_bench"] = (result["harness_median_of_medians_ms"]
                                                 / result["do_bench_median_of_medians_ms"])
    except ImportError:
        result["do_bench"] = "triton not installed"

    print(f"{cand.name} {case.id} on {result['gpu']}, {args.repeats} measurements each")
    print(f"  harness.measure.timing  median {result['harness_median_of_medians_ms']:.4f} ms  "
          f"CV {result['harness_cv']:.3%}  (target <= 0.5%)")
    if "do_bench_cv" in result:
        print(f"  triton do_bench median {result['do_bench_median_of_medians_ms']:.4f} ms  "
              f"CV {result['do_bench_cv']:.3%}")
        print(f"  ratio harness / do_bench {result['ratio_harness_over_do_bench']:.4f}  "
              f"(target within 2%)")
    else:
        print("  triton not installed: no do_bench comparison")
    Path(args.out).write_text(json.dumps(result, indent=2))
    ok = result["harness_cv"] <= 0.005 and abs(
        result.get("ratio_harness_over_do_bench", 1.0) - 1) <= 0.02
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
