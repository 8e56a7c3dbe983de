"""The gradients of attention: the backward oracle (float64) and the same-precision naive
backward, the yardstick of the tolerance rule for dQ, dK and dV.

For out = P V with P = softmax(S), S = scale Q K^T (masked pairs at -inf), and a gradient
dO of the output, the chain rule through the softmax gives

    dV = P^T dO
    dP = dO V^T
    D  = rowsum(dO * O)          (= rowsum(P * dP): one number per query row)
    dS = P * (dP - D)
    dQ = scale dS K
    dK = scale dS^T Q

GQA/MQA: K/V head h_kv serves the G query heads h with h // G == h_kv, so dK and dV of
that head are sums over those G heads. A fully masked row has P = 0, hence dS = 0: its dQ
row is 0 exactly, it adds nothing to dK or dV, and nothing is NaN.

Like the forward oracle (harness.core.reference, whose conventions and blocking it
shares), the work goes in blocks of query rows so that the (rows, Nk) matrices stay
within a byte budget: dQ of a block is final, dK and dV are summed over the blocks.
Nothing optimized imports this module: it is meant to be read.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from harness.core.cases import Case, Inputs
from harness.core.reference import (
    CAUSAL_ALIGNS,
    block_rows_for,
    block_visibility,
    case_flags,
    check_shapes,
    grouped,
)

# The backward keeps about twice the forward's score-sized tensors alive (S, P, dP, dS):
# blocks of half the forward's rows.
_BWD_BLOCK_SHARE = 2

Grads = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _probabilities(s: torch.Tensor, vis: torch.Tensor | None) -> torch.Tensor:
    """Row softmax of scores `s` (any float dtype), masked pairs and fully masked rows 0."""
    if vis is not None:
        s = s.masked_fill(~vis, -math.inf)
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # the -inf guard
    p = torch.exp(s - m)
    denom = p.sum(dim=-1, keepdim=True)
    return p / torch.where(denom > 0, denom, torch.ones_like(denom))


def _ref_grad_block(qg: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor, dog: torch.Tensor,
                    vis: torch.Tensor | None, scale: float) -> Grads:
    """One block in float64: (dQ of the block, its part of dK, its part of dV)."""
    p = _probabilities((qg @ kg.transpose(-1, -2)) * scale, vis)
    o = p @ vg
    dv = p.transpose(-1, -2) @ dog  # the G stacked heads of a group sum here
    dp = dog @ vg.transpose(-1, -2)
    d = (dog * o).sum(dim=-1, keepdim=True)
    ds = p * (dp - d)
    return (ds @ kg) * scale, (ds.transpose(-1, -2) @ qg) * scale, dv


def _naive_grad_block(qg: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor,
                      dog: torch.Tensor, vis: torch.Tensor | None, scale: float) -> Grads:
    # What a careful eager backward does in the input dtype (the forward's naive
    # implementation, then its chain rule): every matmul accumulates in float32 and is
    # rounded to the dtype where an eager kernel would store it (S, O, dP, dS, dQ); P, D
    # and the softmax's arithmetic in float32; dK and dV accumulate in float32 over the
    # query blocks and are rounded once at the end.
    dt = qg.dtype
    s = (qg.float() @ kg.float().transpose(-1, -2)).to(dt).float() * scale
    p32 = _probabilities(s, vis)
    p = p32.to(dt).float()
    o = (p @ vg.float()).to(dt).float()
    dv = p.transpose(-1, -2) @ dog.float()
    dp = (dog.float() @ vg.float().transpose(-1, -2)).to(dt).float()
    d = (dog.float() * o).sum(dim=-1, keepdim=True)
    ds = (p32 * (dp - d)).to(dt).float()
    dq = ((ds @ kg.float()) * scale).to(dt)
    return dq, (ds.transpose(-1, -2) @ qg.float()) * scale, dv


def _blocked_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, *,
                   causal: bool, causal_align: str, mask: torch.Tensor | None,
                   scale: float | None, block_rows: int | None, elem_bytes: int,
                   block_fn: Callable[..., Grads], acc_dtype: torch.dtype,
                   out_dtype: torch.dtype, window: tuple[int, int] = (-1, -1)) -> Grads:
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align must be one of {CAUSAL_ALIGNS}, got {causal_align!r}")
    h, hkv, group = check_shapes(q, k, v)
    b, _, nq, d = q.shape
    nk = k.shape[2]
    if tuple(dout.shape) != tuple(q.shape):
        raise ValueError(f"dout {tuple(dout.shape)} must have q's shape {tuple(q.shape)}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    rows = block_rows or max(1, block_rows_for(b, h, nk, elem_bytes=elem_bytes)
                             // _BWD_BLOCK_SHARE)
    dq = torch.empty((b, h, nq, d), dtype=out_dtype, device=q.device)
    dk = torch.zeros((b, hkv, nk, d), dtype=acc_dtype, device=q.device)
    dv = torch.zeros((b, hkv, nk, d), dtype=acc_dtype, device=q.device)
    for r0 in range(0, nq, rows):
        r = slice(r0, min(r0 + rows, nq))
        n = r.stop - r.start
        qg = grouped(q[:, :, r], hkv, group, n)
        dog = grouped(dout[:, :, r], hkv, group, n)
        vis = block_visibility(r, nq, nk, causal, causal_align, mask, q.device, window)
        vis = None if vis is None else grouped(vis, hkv, group, n)
        dq_blk, dk_blk, dv_blk = block_fn(qg, k, v, dog, vis, scale)
        dq[:, :, r] = dq_blk.reshape(b, h, n, d)
        dk += dk_blk
        dv += dv_blk
    return dq, dk.to(out_dtype), dv.to(out_dtype)


def attention_grad_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
                       *, causal: bool = False, causal_align: str = "bottom_right",
                       mask: torch.Tensor | None = None, scale: float | None = None,
                       block_rows: int | None = None,
                       window: tuple[int, int] = (-1, -1)) -> Grads:
    """Float64 gradients (dQ (B, H, Nq, d), dK and dV (B, Hkv, Nk, d)) of attention with
    output gradient `dout`, on the inputs' device. Conventions as `attention_ref`."""
    q, k, v, dout = q.double(), k.double(), v.double(), dout.double()
    return _blocked_grads(q, k, v, dout, causal=causal, causal_align=causal_align, mask=mask,
                          scale=scale, block_rows=block_rows, elem_bytes=8,
                          block_fn=_ref_grad_block, acc_dtype=torch.float64,
                          out_dtype=torch.float64, window=window)


def attention_grad_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         dout: torch.Tensor, *, causal: bool = False,
                         causal_align: str = "bottom_right", mask: torch.Tensor | None = None,
                         scale: float | None = None, block_rows: int | None = None,
                         window: tuple[int, int] = (-1, -1)) -> Grads:
    """The same-precision naive backward: gradients in the input dtype."""
    return _blocked_grads(q, k, v, dout, causal=causal, causal_align=causal_align, mask=mask,
                          scale=scale, block_rows=block_rows, elem_bytes=4,
                          block_fn=_naive_grad_block, acc_dtype=torch.float32,
                          out_dtype=q.dtype, window=window)


def grad_reference_for_case(case: Case, inputs: Inputs, dout: torch.Tensor) -> Grads:
    return attention_grad_ref(inputs.q, inputs.k, inputs.v, dout, **case_flags(case, inputs))


def grad_naive_for_case(case: Case, inputs: Inputs, dout: torch.Tensor) -> Grads:
    return attention_grad_naive(inputs.q, inputs.k, inputs.v, dout, **case_flags(case, inputs))
