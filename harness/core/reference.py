"""The attention oracle (float64) and the same-precision naive implementation.

`attention_ref` is what every candidate is checked against: plain softmax attention in
float64 on the inputs' device. `attention_naive` is the yardstick of the tolerance rule:
the error a straightforward implementation in the input dtype makes against the oracle
(see harness.core.tolerance). Both work on blocks of query rows so that the (rows, Nk) score
matrix never outgrows a byte budget: N = 16384 at d = 128 stays within a few GB.

Conventions (shared by every candidate):
- layout (B, H, N, d); K/V may have fewer heads (GQA/MQA): query head h reads K/V head
  h // (H // Hkv); V (and so the output) may have a head dim d_v of its own (d_qk = d
  of Q and K, the softmax scale 1/sqrt(d_qk));
- causal "bottom_right" (FlashAttention): query i sees keys j <= i + Nk - Nq;
  causal "top_left" (PyTorch is_causal): j <= i;
- `mask` is boolean, broadcastable to (B, H, Nq, Nk), True = may attend;
- `window` (left, right): row i sees keys i + o - left <= j <= i + o + right (-1: that
  side unbounded), o the offset of `causal_align` (applied with or without causal);
- a fully masked row gives out = 0 exactly and lse = -inf.

Score modifiers (dense cases; with any mask, window and GQA). For query row i, key j and
query head h, in this order:
1. s = scale * q_i . k_j;
2. softcap c > 0: s = c * tanh(s / c) (before the bias and the mask);
3. ALiBi: s += -slope_h * |i + o - j|, o the alignment offset of the causal mask and the
   window (0 under causal top-left, else Nk - Nq: FlashAttention's bottom-right);
4. the mask and window: s = -inf where j is not visible;
5. a sink z_h (a per-head logit in the units of s, neither capped nor biased) joins the
   softmax's denominator only, as a key with no value:
   m = max(max_j s_j, z_h),  out_i = sum_j e^(s_j - m) v_j / (e^(z_h - m) + sum_j e^(s_j - m)),
   lse_i = m + log(e^(z_h - m) + sum_j e^(s_j - m)) = log(e^z_h + sum_j e^s_j).
   A row that sees no key then has out = 0 and lse = z_h (not -inf): the sink holds it all.
The slopes and sink logits are inputs (harness.core.score_mods draws them per case).

FP8 inputs (harness.core.fp8): the oracle computes in float64 from the dequantized
inputs, the exact e4m3 values the candidate receives times their harness-owned descales
(both exact in float64), so the quantisation of the inputs belongs to the problem and the
candidate is judged on what it does with the values it was given. The naive yardstick is
the straightforward kernel of the same precision (`naive_for_case`).

The serving layouts (varlen, paged) reduce to one such call: harness.core.serving writes
their semantics and `serving.oracle_problem` the equivalent dense problem (packed
sequences under a block-diagonal mask, or the pages gathered); `problem_for_case` picks.

Nothing optimized imports this module for computation: it is meant to be read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from harness.core.cases import Case, Dist, Fp8, Inputs, MaskKind
from harness.core.fp8 import dequantized, e4m3, e4m3_scores

# Bytes the per-block working set may use. The float64 oracle keeps about three
# (B, H, rows, Nk) float64 tensors alive at once (scores, probabilities, their exp), plus
# a boolean mask; 512 MiB keeps the N = 16384, d = 128 perf case to a few dozen rows per
# block while leaving the full inputs (upcast once) as the dominant cost.
REF_BUDGET_BYTES = 512 * 2**20
# Live tensors of one block, counted in float64 elements per (b, h, row, key).
_LIVE_PER_SCORE = 3
CAUSAL_ALIGNS = ("bottom_right", "top_left")


def block_rows_for(batch: int, heads: int, seqlen_k: int, *, elem_bytes: int = 8,
                   budget_bytes: int = REF_BUDGET_BYTES) -> int:
    """Query rows per block so that the block's score-sized tensors fit the budget."""
    per_row = batch * heads * seqlen_k * (elem_bytes * _LIVE_PER_SCORE + 1)
    return max(1, budget_bytes // max(per_row, 1))


def block_working_set_bytes(batch: int, heads: int, seqlen_k: int, rows: int, *,
                            elem_bytes: int = 8) -> int:
    """Bytes the score-sized tensors of one block of `rows` query rows occupy."""
    return batch * heads * seqlen_k * rows * (elem_bytes * _LIVE_PER_SCORE + 1)


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int]:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4-D (batch, heads, seq, head_dim)")
    b, h, _, d = q.shape
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same "
                         f"batch, heads and keys")
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)}")
    hkv = k.shape[1]
    if h % hkv:
        raise ValueError(f"q heads ({h}) must be divisible by k/v heads ({hkv})")
    return h, hkv, h // hkv


def block_visibility(rows: slice, nq: int, nk: int, causal: bool, causal_align: str,
                      mask: torch.Tensor | None, device: torch.device,
                      window: tuple[int, int] = (-1, -1)) -> torch.Tensor | None:
    """Boolean visibility of one row block, shaped (B|1, H|1, rows, Nk) or None if all."""
    vis = None
    left, right = window
    if causal or left >= 0 or right >= 0:
        offset = nk - nq if causal_align == "bottom_right" else 0
        i = torch.arange(rows.start, rows.stop, device=device)[:, None] + offset
        j = torch.arange(nk, device=device)[None, :]
        vis = torch.ones((rows.stop - rows.start, nk), dtype=torch.bool, device=device)
        if causal:
            vis &= j <= i
        if right >= 0:
            vis &= j <= i + right
        if left >= 0:
            vis &= j >= i - left
        vis = vis[None, None]
    if mask is not None:
        m = mask.to(device=device, dtype=torch.bool)
        while m.dim() < 4:
            m = m.unsqueeze(0)
        m = m[:, :, rows, :] if m.shape[2] != 1 else m
        vis = m if vis is None else (vis & m)
    return vis


def grouped(t: torch.Tensor, hkv: int, group: int, rows: int) -> torch.Tensor:
    """(B|1, H|1, rows, X) -> (B|1, Hkv|1, G * rows, X): the rows of the G query heads that
    share a K/V head are stacked, so one plain matmul per K/V head serves the whole group
    (K and V are never expanded to H heads, which would copy them G times)."""
    if t.shape[1] == 1:  # the same for every head (a mask): repeat the rows per group
        t = t.expand(t.shape[0], 1, rows, t.shape[3]) if t.shape[2] == 1 else t
        return t.repeat(1, 1, group, 1) if group > 1 else t
    return t.reshape(t.shape[0], hkv, group * t.shape[2], t.shape[3])


@dataclass(frozen=True)
class BlockMods:
    """The score modifiers of one row block, grouped like its scores (`grouped`): softcap
    (0: none), the ALiBi bias (B|1, Hkv, G * rows, Nk) and the sink (1, Hkv, G * rows, 1),
    both float64 (None: none)."""

    softcap: float = 0.0
    bias: torch.Tensor | None = None
    sink: torch.Tensor | None = None


def block_mods(rows: slice, nq: int, nk: int, causal_align: str, softcap: float,
               alibi_slopes: torch.Tensor | None, sinks: torch.Tensor | None, hkv: int,
               group: int, device: torch.device) -> BlockMods | None:
    """The modifiers (module doc) of the query rows `rows`, or None without any."""
    if not softcap and alibi_slopes is None and sinks is None:
        return None
    n = rows.stop - rows.start
    bias = sink = None
    if alibi_slopes is not None:
        offset = nk - nq if causal_align == "bottom_right" else 0
        i = torch.arange(rows.start, rows.stop, device=device)[:, None] + offset
        j = torch.arange(nk, device=device)[None, :]
        dist = (i - j).abs().double()  # |i + o - j|, (rows, Nk)
        slopes = alibi_slopes.to(device=device, dtype=torch.float64)
        bias = grouped(-slopes[None, :, None, None] * dist[None, None], hkv, group, n)
    if sinks is not None:
        z = sinks.to(device=device, dtype=torch.float64)[None, :, None, None]
        sink = grouped(z.expand(1, z.shape[1], n, 1), hkv, group, n)
    return BlockMods(float(softcap), bias, sink)


def _modified(s: torch.Tensor, mods: BlockMods | None) -> torch.Tensor:
    """Steps 2 and 3 of the module doc (softcap, then the ALiBi bias), in s's dtype."""
    if mods is None:
        return s
    if mods.softcap:
        s = mods.softcap * torch.tanh(s / mods.softcap)
    if mods.bias is not None:
        s = s + mods.bias.to(s.dtype)
    return s


def _blocked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                       causal_align: str, mask: torch.Tensor | None, scale: float | None,
                       block_rows: int | None, elem_bytes: int,
                       block_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
                       out_dtype: torch.dtype, lse_dtype: torch.dtype,
                       window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                       alibi_slopes: torch.Tensor | None = None,
                       sinks: torch.Tensor | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align must be one of {CAUSAL_ALIGNS}, got {causal_align!r}")
    h, hkv, group = check_shapes(q, k, v)
    b, _, nq, d = q.shape
    nk, dv = k.shape[2], v.shape[3]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    rows = block_rows or block_rows_for(b, h, nk, elem_bytes=elem_bytes)
    out = torch.empty((b, h, nq, dv), dtype=out_dtype, device=q.device)
    lse = torch.empty((b, h, nq), dtype=lse_dtype, device=q.device)
    for r0 in range(0, nq, rows):
        r = slice(r0, min(r0 + rows, nq))
        n = r.stop - r.start
        qg = grouped(q[:, :, r], hkv, group, n)  # (B, Hkv, G * rows, d)
        vis = block_visibility(r, nq, nk, causal, causal_align, mask, q.device, window)
        vis = None if vis is None else grouped(vis, hkv, group, n)
        mods = block_mods(r, nq, nk, causal_align, softcap, alibi_slopes, sinks, hkv, group,
                          q.device)
        o_blk, lse_blk = block_fn(qg, k, v, vis, scale, mods)
        out[:, :, r] = o_blk.reshape(b, h, n, dv)
        lse[:, :, r] = lse_blk.reshape(b, h, n)
    return out, lse


def _ref_block(qg: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor,
               vis: torch.Tensor | None, scale: float, mods: BlockMods | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    s = _modified((qg @ kg.transpose(-1, -2)) * scale, mods)  # inputs are float64 already
    if vis is not None:
        s = s.masked_fill(~vis, -math.inf)
    m = s.amax(dim=-1, keepdim=True)
    sink = None if mods is None else mods.sink
    if sink is not None:  # the sink takes part in the max (step 5), and is finite
        m = torch.maximum(m, sink)
    # -inf guard: a fully masked row has m = -inf and exp(-inf - (-inf)) would be NaN;
    # subtracting 0 instead leaves every exp at exactly 0, so the row sum is 0 below.
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    denom = p.sum(dim=-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink - m)  # in the denominator only, with no value
    o = (p @ vg) / torch.where(denom > 0, denom, torch.ones_like(denom))
    lse = (m + torch.log(denom)).squeeze(-1)  # log(0) = -inf for fully masked rows
    return o, lse


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                  causal_align: str = "bottom_right", mask: torch.Tensor | None = None,
                  scale: float | None = None, block_rows: int | None = None,
                  window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                  alibi_slopes: torch.Tensor | None = None,
                  sinks: torch.Tensor | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 attention on the inputs' device: (out (B, H, Nq, d_v), lse (B, H, Nq)), both
    float64. Fully masked rows: out 0, lse -inf (with sinks: the sink logit).
    `block_rows` overrides the budget. `softcap`, `alibi_slopes` (H,) and `sinks` (H,)
    are the score modifiers of the module doc."""
    # Upcast once (not per block): per-block conversions of K/V would dominate at large N.
    q, k, v = q.double(), k.double(), v.double()
    return _blocked_attention(q, k, v, causal=causal, causal_align=causal_align, mask=mask,
                              scale=scale, block_rows=block_rows, elem_bytes=8,
                              block_fn=_ref_block, out_dtype=torch.float64,
                              lse_dtype=torch.float64, window=window, softcap=softcap,
                              alibi_slopes=alibi_slopes, sinks=sinks)


def _naive_block(qg: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor,
                 vis: torch.Tensor | None, scale: float, mods: BlockMods | None = None,
                 *, round_s: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    # What a careful eager implementation does in the input dtype: QK^T in the dtype,
    # scale and softmax in float32, P cast back to the dtype, PV in the dtype. A matmul "in
    # the dtype" is float32 accumulation rounded to the dtype (what GPU matmuls do); it is
    # written out that way so that CPU and GPU agree and the CPU, whose half-precision
    # matmuls are slow, stays fast. Products of fp16/bf16 values are exact in float32.
    dt = qg.dtype
    # The score modifiers in float32 too, where a kernel applies them.
    s = qg.float() @ kg.float().transpose(-1, -2)
    s = (s.to(dt).float() if round_s else s) * scale  # round_s=False: S kept in float32
    s = _modified(s, mods)
    if vis is not None:
        s = s.masked_fill(~vis, -math.inf)
    sink = None if mods is None or mods.sink is None else mods.sink.float()
    if sink is not None:  # the sink as one more logit of the row, with no value
        lse = torch.logsumexp(torch.cat((s, sink.expand(*s.shape[:-1], 1)), dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)  # -inf on fully masked rows
    m = s.amax(dim=-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    denom = p.sum(dim=-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink - m)
    p = (p / torch.where(denom > 0, denom, torch.ones_like(denom))).to(dt)
    return (p.float() @ vg.float()).to(dt), lse


def attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    causal_align: str = "bottom_right", mask: torch.Tensor | None = None,
                    scale: float | None = None, block_rows: int | None = None,
                    window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: torch.Tensor | None = None,
                    sinks: torch.Tensor | None = None, round_s: bool = True,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Same-precision naive attention: (out in the input dtype, lse float32). Same
    conventions as `attention_ref`, fully masked rows 0 (and lse -inf, or the sink).
    `round_s` False keeps S = QK^T in float32 instead of rounding it to the dtype."""
    return _blocked_attention(q, k, v, causal=causal, causal_align=causal_align, mask=mask,
                              scale=scale, block_rows=block_rows, elem_bytes=4,
                              block_fn=partial(_naive_block, round_s=round_s),
                              out_dtype=q.dtype,
                              lse_dtype=torch.float32, window=window, softcap=softcap,
                              alibi_slopes=alibi_slopes, sinks=sinks)


def case_flags(case: Case, inputs: Inputs) -> dict:
    """Keyword flags of `attention_ref`/`attention_naive` that express a dense case's mask,
    window (aligned like the causal mask: top-left only under CAUSAL_TL) and score
    modifiers (ALiBi aligned the same way)."""
    align = "top_left" if case.mask is MaskKind.CAUSAL_TL else "bottom_right"
    flags: dict = {"causal": case.mask.is_causal, "causal_align": align, "mask": None}
    if case.has_window:
        flags["window"] = (case.window_left, case.window_right)
    if case.softcap:
        flags["softcap"] = case.softcap
    for name, needed in (("alibi_slopes", case.alibi), ("sinks", case.sinks)):
        if needed:
            if getattr(inputs, name) is None:
                raise ValueError(f"case {case.id} needs inputs.{name}")
            flags[name] = getattr(inputs, name)
    if case.mask in (MaskKind.KEY_PADDING, MaskKind.RANDOM):
        if inputs.mask is None:
            raise ValueError(f"case {case.id} needs inputs.mask for mask kind {case.mask.value}")
        flags["mask"] = inputs.mask
    return flags


def problem_for_case(case: Case, inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor,
                                                           torch.Tensor, dict]:
    """(q, k, v, flags) of the one plain attention call that is `case` (module doc); an
    fp8 case's q, k and v are its dequantized inputs in float64."""
    if case.fp8 is not Fp8.NONE:
        inputs = dequantized(inputs, torch.float64)
    return _problem(case, inputs)


def _problem(case: Case, inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                  dict]:
    if case.is_serving:
        from harness.core.serving import oracle_problem

        q, k, v, mask = oracle_problem(case, inputs)
        return q, k, v, {"causal": False, "mask": mask}
    return inputs.q, inputs.k, inputs.v, case_flags(case, inputs)


def reference_for_case(case: Case, inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 oracle of `case`; an fp8 case's from its dequantized inputs: the e4m3
    values the candidate receives times their descales, exact in float64."""
    q, k, v, flags = problem_for_case(case, inputs)
    return attention_ref(q, k, v, **flags)


def naive_for_case(case: Case, inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The naive yardstick of `case`. On large-magnitude inputs it keeps S in float32: S
    rounded to fp16 overflows there (harness.core.distributions), and the straightforward
    kernel the tolerance measures against is then one that does not round it.

    FP8 cases (harness.core.fp8), from the same e4m3 values and descales the candidate
    gets, so that "k times the error a straightforward kernel makes" keeps its meaning:
    - an e4m3 KV cache: the straightforward decode kernel dequantizes each K/V tile into
      Q's dtype as it loads it (e4m3 x descale in float32, rounded to the dtype) and is
      the half-precision naive kernel from there on;
    - e4m3 Q, K, V: the straightforward FP8 kernel (`attention_naive_fp8`). Computing in
      float32 from the dequantized inputs instead would make the yardstick's error the
      output's rounding alone, and every FP8 kernel whose PV product runs on e4m3 P (the
      point of FP8) would fail a rule meant to allow the error of its precision."""
    if case.fp8.quantizes_q:   # dense only: q and k are the e4m3 values, V dequantized
        _, _, v, flags = _problem(case, dequantized(inputs, torch.float32))
        return attention_naive_fp8(inputs.q.float(), inputs.k.float(), v,
                                   out_dtype=case.torch_dtype,
                                   descales=(inputs.q_descale, inputs.k_descale), **flags)
    if case.fp8 is not Fp8.NONE:
        inputs = dequantized(inputs, case.torch_dtype)
    q, k, v, flags = _problem(case, inputs)
    return attention_naive(q, k, v, round_s=case.dist is not Dist.LARGE, **flags)


def _fp8_naive_block(qg: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor,
                     vis: torch.Tensor | None, scale: float, mods: BlockMods | None = None,
                     descale: Callable[[int], torch.Tensor] | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    # dequantized q and k: S in float32; e4m3 q and k: Q8 K8^T as an FP8 kernel's MMAs
    # accumulate it, times d_q d_k
    s = (qg @ kg.transpose(-1, -2) if descale is None
         else e4m3_scores(qg, kg) * descale(qg.shape[2]))
    s = _modified(s * scale, mods)
    if vis is not None:
        s = s.masked_fill(~vis, -math.inf)
    sink = None if mods is None or mods.sink is None else mods.sink.float()
    m = s.amax(dim=-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)  # in [0, 1]: what an FP8 kernel rounds to e4m3 for P V
    denom = p.sum(dim=-1, keepdim=True)  # l from the float32 P, before the rounding
    if sink is not None:
        denom = denom + torch.exp(sink - m)
    lse = (m + torch.log(denom)).squeeze(-1)
    o = (p.to(e4m3()).float() @ vg) / torch.where(denom > 0, denom, torch.ones_like(denom))
    return o, lse


def attention_naive_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                        out_dtype: torch.dtype, causal: bool = False,
                        causal_align: str = "bottom_right", mask: torch.Tensor | None = None,
                        scale: float | None = None, block_rows: int | None = None,
                        window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                        alibi_slopes: torch.Tensor | None = None,
                        sinks: torch.Tensor | None = None,
                        descales: tuple[torch.Tensor, torch.Tensor] | None = None,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """The straightforward FP8 attention kernel (FlashAttention-3's FP8 forward without
    its tiling), in float32: q, k, v the dequantized e4m3 inputs, or with `descales`
    (d_q, d_k as harness.core.fp8 hands them) q and k the e4m3 values themselves, S = Q K^T
    then as FP8 tensor cores accumulate it where the device has them (`e4m3_scores`),
    times d_q d_k. The softmax in float32, P = exp(S - m) rounded to e4m3 for the P V
    product (accumulated in float32, V's descale applied with it), O divided by l (summed
    before the rounding) and rounded to `out_dtype`; lse float32. Same conventions as
    `attention_ref`."""
    block_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] = _fp8_naive_block
    if descales is not None:
        hkv, group = k.shape[1], q.shape[1] // k.shape[1]
        dq, dk = (d.float()[..., None] for d in descales)   # (B|1, heads|1, 1, 1)

        def descale(grouped_rows: int) -> torch.Tensor:
            if dq.shape[1] == 1:   # one Q descale per tensor: no grouping to follow
                return dq * dk
            rows = grouped_rows // group
            return grouped(dq.expand(dq.shape[0], dq.shape[1], rows, 1), hkv, group, rows) * dk

        block_fn = partial(_fp8_naive_block, descale=descale)
    return _blocked_attention(q, k, v, causal=causal, causal_align=causal_align, mask=mask,
                              scale=scale, block_rows=block_rows, elem_bytes=4,
                              block_fn=block_fn, out_dtype=out_dtype,
                              lse_dtype=torch.float32, window=window, softcap=softcap,
                              alibi_slopes=alibi_slopes, sinks=sinks)
