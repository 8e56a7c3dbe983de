"""`fa-harness calibrate`: measure this runner's copy bandwidth and matmul rates."""

from __future__ import annotations

import argparse
import json
import sys

from harness.cli.errors import EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="measure the runner's copy bandwidth and fp16/bf16 matmul rates",
        description="Measure device copy bandwidth and 8192^3 fp16/bf16 matmul throughput "
                    "with the harness timing method and save them with the GPU identity "
                    "(default ~/.cache/fa-harness/calibration-<gpu uuid>.json). "
                    "Exit 2 without a CUDA GPU.")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    p.add_argument("--out", metavar="FILE", help="where to write the calibration file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        raise UsageError("no CUDA GPU available: calibration measures a GPU")
    from harness.measure.calibrate import calibrate, default_path
    from harness.measure.gpuinfo import describe

    cal = calibrate()
    path = cal.save(args.out or default_path(cal.gpu.uuid))
    if args.json:
        json.dump(cal.to_dict(), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        rates = ", ".join(f"{dt} matmul {v:.1f} TFLOP/s"
                          for dt, v in cal.matmul_tflops_by_dtype.items())
        print(f"{describe(cal.gpu)}\ncopy {cal.copy_gbps:.0f} GB/s (read + write), {rates}")
    print(f"calibration written to {path}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK
