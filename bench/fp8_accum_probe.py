"""How precisely the GPU's FP8 tensor cores accumulate a product of e4m3 matrices, the
question behind an FP8 attention kernel's LSE error (its S = Q K^T comes from them).

Q and K are e4m3 with per-tensor scaling (the harness's quantisation: N(0, 1) values, the
amax mapped to 448), shaped like one head of attention (N x d times d x N). The exact
product (float64 of the e4m3 values; every product of two e4m3 values is exact in float32
and the sums are exact in float64 at these sizes) is compared with:
- float32 accumulation on CUDA cores (torch.matmul of the values in float32),
- torch._scaled_mm (cuBLASLt's FP8 GEMM) with use_fast_accum=False (its partial sums
  promoted to float32 at intervals) and with use_fast_accum=True (the tensor core's own
  accumulation over the whole reduction, as a kernel issuing wgmma in a chain has it).
Printed: the largest and the median error relative to sum_j |q_ij k_jl| (the scale of the
terms), and in units of 2^-k, per d.

    python bench/fp8_accum_probe.py            # needs a GPU with FP8 (sm_89+)
"""

from __future__ import annotations

import argparse
import math

import torch


def quantized(x: torch.Tensor) -> torch.Tensor:
    """e4m3 values of x scaled so that its amax is 448 (the values, as float32)."""
    scale = 448.0 / x.abs().amax()
    return (x * scale).to(torch.float8_e4m3fn).float()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--dims", default="64,128,256")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'d':>4} {'method':<22} {'max rel':>10} {'median rel':>11} {'max as 2^-k':>12}")
    for d in (int(x) for x in args.dims.split(",")):
        q = quantized(torch.randn(args.n, d, device="cuda", generator=gen))
        k = quantized(torch.randn(args.n, d, device="cuda", generator=gen))
        exact = q.double() @ k.double().T
        mag = q.double().abs() @ k.double().abs().T
        one = torch.ones((), device="cuda")
        q8, k8 = q.to(torch.float8_e4m3fn), k.to(torch.float8_e4m3fn)
        got = {"float32 CUDA cores": (q @ k.T)}
        for fast in (False, True):
            got[f"_scaled_mm fast={fast}"] = torch._scaled_mm(
                q8, k8.T, scale_a=one, scale_b=one, out_dtype=torch.float32,
                use_fast_accum=fast)
        for name, s in got.items():
            rel = ((s.double() - exact).abs() / mag).flatten()
            worst = rel.max().item()
            bits = -math.log2(worst) if worst > 0 else float("inf")
            print(f"{d:>4} {name:<22} {worst:>10.3e} {rel.median().item():>11.3e} {bits:>12.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
