"""The `mods` grid: the attention of today's models. Score modifiers (softcap, ALiBi,
sinks), head dims past 128 and a V head dim of its own, input distributions other than
N(0, 1) (docs/score-mods.md), and FP8 inputs and KV caches (docs/fp8.md);
harness.core.grids lists it with the other grids.
"""

from __future__ import annotations

from harness.core.cases import Case, Dist, Fp8, Layout, MaskKind

# The score modifiers the mods grid meets (harness.core.reference's doc): each alone, and
# all three together. A softcap of 10 bends the scores of N(0, 1) inputs measurably (30,
# Grok's, and 50, Gemma 2's, barely do at this scale: their effect stays within the
# tolerance of half-precision inputs).
MOD_SETS: tuple[dict, ...] = ({"softcap": 10.0}, {"alibi": True}, {"sinks": True},
                              {"softcap": 20.0, "alibi": True, "sinks": True})
# (batch, heads, kv_heads, Nq, Nk, d, dtype, mask, window_left): every mask kind, Nq > Nk
# and Nq < Nk under bottom-right causal (fully masked rows, and ALiBi's alignment), GQA
# and MQA, a causal sliding window, a decode row.
MOD_SHAPES = (
    (2, 4, 4, 113, 203, 64, "float16", MaskKind.NONE, -1),
    (2, 4, 2, 203, 113, 64, "bfloat16", MaskKind.CAUSAL_BR, -1),
    (2, 6, 2, 113, 203, 128, "float16", MaskKind.CAUSAL_BR, -1),
    (2, 4, 1, 113, 203, 64, "bfloat16", MaskKind.CAUSAL_TL, -1),
    (3, 4, 2, 97, 130, 64, "float16", MaskKind.KEY_PADDING, -1),
    (2, 4, 4, 70, 150, 64, "bfloat16", MaskKind.RANDOM, -1),
    (2, 4, 2, 113, 203, 64, "float16", MaskKind.CAUSAL_BR, 48),
    (1, 8, 2, 1, 239, 128, "bfloat16", MaskKind.NONE, -1),
)


# The head dims of today's models beyond 64 and 128: 96, and the 192 and 256 of large
# models, each on three shapes; d_qk = 192 with d_v = 128 (an MLA prefill's), and once the
# other way round. (batch, heads, kv_heads, Nq, Nk, dtype, mask).
LARGE_HEAD_DIMS = (96, 192, 256)
DIM_SHAPES = ((2, 4, 4, 113, 203, "float16", MaskKind.NONE),
              (2, 4, 2, 203, 113, "bfloat16", MaskKind.CAUSAL_BR),
              (1, 4, 1, 128, 217, "float16", MaskKind.KEY_PADDING))
SPLIT_DIMS = (192, 128)  # (d_qk, d_v)
SPLIT_SHAPES = ((2, 4, 4, 113, 203, "float16", MaskKind.NONE),
                (2, 4, 2, 203, 113, "bfloat16", MaskKind.CAUSAL_BR),
                (2, 4, 4, 64, 150, "bfloat16", MaskKind.RANDOM),
                (1, 8, 1, 1, 239, "float16", MaskKind.NONE))


# Input distributions other than normal (harness.core.distributions): (batch, heads,
# kv_heads, Nq, Nk, d, dtype, mask).
DIST_SHAPES = ((2, 4, 4, 113, 203, 64, "float16", MaskKind.NONE),
               (2, 4, 2, 203, 113, 64, "bfloat16", MaskKind.CAUSAL_BR),
               (1, 4, 1, 128, 217, 128, "float16", MaskKind.KEY_PADDING),
               (2, 4, 4, 70, 150, 128, "bfloat16", MaskKind.RANDOM))


# FP8 (harness.core.fp8). e4m3 Q, K and V with per-tensor and per-head descales, on
# every mask kind, GQA and MQA, d = 64 and 128, once with softcap and sinks and once on
# outliers (a per-tensor scale the outliers set): (batch, heads, kv_heads, Nq, Nk, d,
# dtype, mask, fp8, extra fields).
FP8_QKV_SHAPES: tuple[tuple, ...] = (
    (2, 4, 4, 113, 203, 64, "float16", MaskKind.NONE, Fp8.QKV_TENSOR, {}),
    (2, 4, 2, 203, 113, 64, "bfloat16", MaskKind.CAUSAL_BR, Fp8.QKV_HEAD, {}),
    (2, 4, 1, 113, 203, 128, "bfloat16", MaskKind.CAUSAL_TL, Fp8.QKV_TENSOR, {}),
    (3, 4, 2, 97, 130, 128, "float16", MaskKind.KEY_PADDING, Fp8.QKV_HEAD, {}),
    (2, 4, 2, 113, 203, 64, "bfloat16", MaskKind.CAUSAL_BR, Fp8.QKV_HEAD,
     {"softcap": 20.0, "sinks": True}),
    (2, 4, 4, 70, 150, 64, "float16", MaskKind.RANDOM, Fp8.QKV_TENSOR,
     {"dist": Dist.OUTLIERS}),
    # d = 128 over several Q blocks and key tiles, and with the modifiers: an FP8 kernel
    # built for d = 128 only (fa3_wgmma's) meets each of its entries here.
    (2, 4, 1, 300, 517, 128, "bfloat16", MaskKind.CAUSAL_BR, Fp8.QKV_HEAD, {}),
    (1, 8, 2, 257, 700, 128, "float16", MaskKind.NONE, Fp8.QKV_TENSOR,
     {"softcap": 20.0, "sinks": True}),
)
# e4m3 KV caches with per-head and per-token descales, Q in the dtype: decode rows over a
# dense cache (one row, and four under a causal mask: speculative decoding), paged caches
# with pages smaller and larger than a key tile and pages of 24 keys (a key tile spans
# two) under a sliding window, a varlen decode batch, and key padding without GQA.
FP8_KV_CASES = (
    Case(1, 8, 2, 1, 239, 128, "bfloat16", MaskKind.NONE, fp8=Fp8.KV_HEAD),
    Case(4, 8, 1, 1, 517, 128, "float16", MaskKind.NONE, fp8=Fp8.KV_TOKEN),
    Case(4, 8, 2, 4, 300, 64, "float16", MaskKind.CAUSAL_BR, fp8=Fp8.KV_TOKEN),
    Case(5, 4, 2, 1, 239, 64, "float16", MaskKind.NONE, layout=Layout.PAGED, page_size=16,
         fp8=Fp8.KV_HEAD),
    Case(5, 6, 2, 16, 1024, 64, "bfloat16", MaskKind.CAUSAL_BR, layout=Layout.PAGED,
         page_size=256, fp8=Fp8.KV_TOKEN),
    Case(3, 8, 2, 2, 400, 64, "float16", MaskKind.CAUSAL_BR, window_left=100,
         layout=Layout.PAGED, page_size=24, fp8=Fp8.KV_TOKEN),
    Case(4, 8, 2, 1, 700, 128, "bfloat16", MaskKind.NONE, layout=Layout.VARLEN,
         fp8=Fp8.KV_TOKEN),
    Case(3, 8, 8, 1, 1000, 128, "float16", MaskKind.KEY_PADDING, fp8=Fp8.KV_HEAD),
)


def mods() -> list[Case]:
    """The grid of today's models' attention (72 cases): every MOD_SETS entry on every
    MOD_SHAPES shape; head dims 96, 192 and 256 on the DIM_SHAPES; d_qk = 192 with
    d_v = 128 on the SPLIT_SHAPES, once with softcap and sinks as well, and d_qk = 128
    with d_v = 192 once; the outliers and large input distributions on the DIST_SHAPES,
    and three combinations of them with the rest; the FP8_QKV_SHAPES and FP8_KV_CASES.
    Only candidates declaring the modifiers (and d_v != d_qk, the head dims, fp8 and
    fp8_kv, the paged layout) run those cases; the others skip each with the reason.
    Every candidate runs the distributions' plain cases."""
    cases = [Case(b, h, kv, nq, nk, d, dt, mask, window_left=wl, **mod)
             for mod in MOD_SETS for b, h, kv, nq, nk, d, dt, mask, wl in MOD_SHAPES]
    cases += [Case(b, h, kv, nq, nk, d, dt, mask)
              for d in LARGE_HEAD_DIMS for b, h, kv, nq, nk, dt, mask in DIM_SHAPES]
    d, dv = SPLIT_DIMS
    cases += [Case(b, h, kv, nq, nk, d, dt, mask, head_dim_v=dv)
              for b, h, kv, nq, nk, dt, mask in SPLIT_SHAPES]
    cases += [Case(2, 4, 2, 113, 203, d, "float16", MaskKind.CAUSAL_TL, softcap=20.0,
                   sinks=True, head_dim_v=dv),
              Case(2, 4, 2, 113, 203, dv, "float16", MaskKind.CAUSAL_BR, head_dim_v=d)]
    cases += [Case(b, h, kv, nq, nk, hd, dt, mask, dist=dist)
              for dist in (Dist.OUTLIERS, Dist.LARGE)
              for b, h, kv, nq, nk, hd, dt, mask in DIST_SHAPES]
    cases += [Case(2, 4, 2, 113, 203, 64, "float16", MaskKind.CAUSAL_TL, softcap=30.0,
                   dist=Dist.LARGE),
              Case(2, 4, 2, 203, 113, 64, "bfloat16", MaskKind.CAUSAL_BR, alibi=True,
                   sinks=True, dist=Dist.OUTLIERS),
              Case(2, 4, 4, 113, 203, d, "bfloat16", MaskKind.NONE, head_dim_v=dv,
                   dist=Dist.LARGE)]
    cases += [Case(b, h, kv, nq, nk, hd, dt, mask, fp8=fp8, **extra)
              for b, h, kv, nq, nk, hd, dt, mask, fp8, extra in FP8_QKV_SHAPES]
    cases += FP8_KV_CASES
    return cases
