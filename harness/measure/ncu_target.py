"""The program Nsight Compute profiles: one launch of one candidate on one case.

    python -m harness.measure.ncu_target --kernel NAME --case ID [--variant PATH]

A warm-up launch first (compilation, plan selection, allocations happen there), then the
measured launch between cudaProfilerStart/Stop, which `ncu --profile-from-start off`
limits profiling to. Exit 0 on success, 2 on bad input, 1 when the launch fails.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.measure.ncu_target")
    ap.add_argument("--kernel", required=True, help="candidate name")
    ap.add_argument("--case", required=True, help="case id, e.g. b1h1-4096x4096-d64-fp16-none")
    ap.add_argument("--variant", help="variant folder or annotated .cu (not in the registry)")
    ap.add_argument("--sandboxed-build", action="store_true",
                    help="build the variant with nvcc in the compile sandboxes (submissions)")
    args = ap.parse_args(argv)

    import torch

    from harness.core.cases import Case, make_inputs
    from harness.execution.isolate import build_candidate
    from harness.measure.perf import make_launch, output_buffers

    try:
        case = Case.from_id(args.case)
    except ValueError as e:
        print(f"ncu_target: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("ncu_target: no CUDA GPU available", file=sys.stderr)
        return 2
    options = {"variant_path": args.variant} if args.variant else {}
    if args.sandboxed_build:
        options["sandboxed_build"] = True
    try:
        cand = build_candidate(args.kernel, options)
    except Exception as e:
        print(f"ncu_target: cannot build {args.kernel}: {e}", file=sys.stderr)
        return 2
    reason = cand.supports(case)
    if reason:
        print(f"ncu_target: {args.kernel} does not support {case.id}: {reason}", file=sys.stderr)
        return 2
    inputs = make_inputs(case, "cuda")
    out, lse = output_buffers(cand, case)
    launch = make_launch(cand, case, [inputs], out, lse)
    try:
        launch(0)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        launch(0)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    except Exception as e:
        print(f"ncu_target: launch failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
