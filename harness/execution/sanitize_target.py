"""The program compute-sanitizer runs: a submission on a few cases, once each.

    python -m harness.execution.sanitize_target --variant PATH --cases ID[,ID...] [--trusted]
        [--backward [--no-forward]]

The variant is built with nvcc in the compile sandbox (as the worker builds it) with
`-lineinfo`, so findings name the submission's source line; with `--trusted` (the CI
gate's tier, on the team's own source) it is built with NVRTC as the gate builds it. Inputs are drawn as for any
case; outputs go to the harness's guarded buffers. `--backward` runs the variant's
`[backward]` launches (after its forward; without it, `--no-forward`) into guarded dQ, dK,
dV buffers, on each case its backward supports, with the O and LSE the backward check gives
it (harness.core.check_grad.grad_inputs), and twice per case, as the check calls it: the
second call finds the workspaces the first left. Exit 0 when every launch returned, 1 when
a launch raised (the sanitizer's report says why), 2 on bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.execution.sanitize_target")
    ap.add_argument("--variant", required=True, help="variant folder or annotated .cu")
    ap.add_argument("--cases", required=True, help="comma-separated case ids")
    ap.add_argument("--trusted", action="store_true",
                    help="the team's own source: NVRTC in this process, no sandbox")
    ap.add_argument("--name", help="the folder's [[flavor]] of this name")
    ap.add_argument("--backward", action="store_true",
                    help="also run the manifest's [backward] launches on each case")
    ap.add_argument("--no-forward", action="store_true",
                    help="with --backward: the backward's launches only")
    args = ap.parse_args(argv)
    if args.no_forward and not args.backward:
        print("sanitize_target: --no-forward needs --backward", file=sys.stderr)
        return 2

    import torch

    from harness.candidates.cuda_candidate import CudaVariant
    from harness.candidates.variants import VariantError, load_variant
    from harness.core.buffers import OutputBuffers
    from harness.core.cases import Case, make_inputs

    try:
        cases = [Case.from_id(c) for c in args.cases.split(",") if c]
        spec = load_variant(args.variant, args.name)
    except (ValueError, VariantError) as e:
        print(f"sanitize_target: {e}", file=sys.stderr)
        return 2
    if "-lineinfo" not in spec.compile_options:
        spec = dataclasses.replace(spec, compile_options=(*spec.compile_options, "-lineinfo"))
    cand = CudaVariant.from_spec(spec)
    cand.sandboxed_build = not args.trusted
    if not torch.cuda.is_available():
        print("sanitize_target: no CUDA GPU available", file=sys.stderr)
        return 2
    for case in cases:
        if cand.supports(case):
            continue
        try:
            if not args.no_forward:
                inputs = make_inputs(case, "cuda")
                bufs = OutputBuffers.allocate(case, "cuda", cand.support.writes_lse)
                bufs.poison()
                cand.run(case, inputs, bufs.out, bufs.lse)
                torch.cuda.synchronize()
            if args.backward and cand.support.backward and \
                    cand.backward_unsupported(case) is None:
                _backward(cand, case)
        except Exception as e:  # noqa: BLE001 - reported, the sanitizer has the detail
            print(f"sanitize_target: {case.id}: {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:150] if str(e) else ''}", file=sys.stderr)
            return 1
    return 0


def _backward(cand, case) -> None:  # noqa: ANN001 - a CudaVariant, a Case
    import torch

    from harness.core.buffers import GradBuffers
    from harness.core.check_grad import grad_inputs

    inputs = grad_inputs(case, cand, "cuda")
    bufs = GradBuffers.allocate(case, "cuda")
    for _ in range(2):  # the module doc: the second call finds the first one's workspaces
        bufs.poison()
        cand.run_backward(case, inputs, *bufs.grads)
        torch.cuda.synchronize()


if __name__ == "__main__":
    sys.exit(main())
