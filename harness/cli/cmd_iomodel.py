"""`fa-harness iomodel`: HBM bytes, arithmetic intensity and roofline of each algorithm."""

from __future__ import annotations

import argparse
import json

from harness.cli.errors import EXIT_OK, UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("iomodel", help="HBM traffic / roofline of naive attention, FA1, FA2, "
                                       "split-KV")
    p.add_argument("--seq-len", type=int, default=4096, help="query length N (default 4096)")
    p.add_argument("--seq-len-k", type=int, default=None, help="key length (default: N)")
    p.add_argument("--head-dim", type=int, default=64, help="d (default 64)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--kv-heads", type=int, default=None, help="K/V heads (default: --heads)")
    p.add_argument("--block-q", type=int, default=64, help="B_q (FA2, split-KV; default 64)")
    p.add_argument("--block-k", type=int, default=64, help="B_k (FA1, causal skip; default 64)")
    p.add_argument("--splits", type=int, default=1, help="split-KV splits (default 1)")
    p.add_argument("--dtype", default="float16", help="float16 | bfloat16 (default float16)")
    p.add_argument("--causal", action="store_true", help="bottom-right causal mask")
    p.add_argument("--gpu", default="h100-sxm", help="GPU spec for the roofline (default "
                                                       "h100-sxm)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def model(args: argparse.Namespace) -> dict:
    from harness.core import iomodel
    from harness.core.cases import Case, MaskKind
    from harness.core.flops import attention_flops

    try:
        spec = iomodel.get_gpu(args.gpu)
        case = Case(args.batch, args.heads, args.kv_heads or args.heads, args.seq_len,
                    args.seq_len_k or args.seq_len, args.head_dim, args.dtype,
                    MaskKind.CAUSAL_BR if args.causal else MaskKind.NONE)
        tiles = {"block_q": args.block_q, "block_k": args.block_k, "splits": args.splits}
        flops = attention_flops(case)
        out: dict = {"case": case.id, "gpu": spec.name, "peak_tflops": spec.tflops_fp16,
                     "hbm_tbps": spec.hbm_tbps, "ridge_flop_per_byte": spec.ridge,
                     "flops": flops, "tiles": tiles}
        for algo in iomodel.ALGORITHMS:
            nbytes = iomodel.hbm_bytes(algo, case, tiles)
            ai = iomodel.arithmetic_intensity(flops, nbytes)
            out[algo] = {"hbm_bytes": nbytes, "hbm_mib": nbytes / 2**20,
                         "arithmetic_intensity": ai,
                         "roofline_tflops": iomodel.roofline_tflops(ai, spec),
                         "bound": "compute" if ai >= spec.ridge else "bandwidth"}
    except ValueError as e:
        raise UsageError(str(e)) from None
    return out


def run(args: argparse.Namespace) -> int:
    from harness.core.iomodel import ALGORITHMS

    out = model(args)
    if args.json:
        print(json.dumps(out))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{out['case']} on {out['gpu']} ({out['peak_tflops']:g} TFLOP/s, "
                    f"{out['hbm_tbps']:g} TB/s, ridge {out['ridge_flop_per_byte']:.0f} FLOP/B)",
              caption=f"{out['flops'] / 1e9:.2f} GFLOP; MiB = 2^20 bytes")
    for col in ("algorithm", "HBM MiB", "FLOP/B", "roofline TFLOP/s", "bound"):
        t.add_column(col, justify="left" if col in ("algorithm", "bound") else "right")
    for algo in ALGORITHMS:
        r = out[algo]
        t.add_row(algo, f"{r['hbm_mib']:,.2f}", f"{r['arithmetic_intensity']:,.1f}",
                  f"{r['roofline_tflops']:,.1f}", r["bound"])
    Console(highlight=False).print(t)
    return EXIT_OK
