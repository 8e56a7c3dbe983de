"""The named case grids: smoke, full, perf, decode, serving, mods, and the backward's
perf-bwd.

Every grid is a deterministic list (same order in every process, which pytest-xdist
needs). Inputs are drawn per case from the case id (harness.core.cases.derive_seed), so every
combination gets its own seeded draw and the `seed` field stays 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.core.cases import Case, Fp8, Layout, MaskKind
from harness.core.grid_full import (  # noqa: F401 - the full grid's names, re-exported
    ANCHOR_PAIRS,
    BATCHES,
    DECODE_MAX_SEQLEN_Q,
    DTYPES,
    FULL_BIG_PAIRS,
    FULL_DECODE_PAIRS,
    FULL_DRAWS_PER_COMBINATION,
    FULL_LONG_KEYS,
    FULL_SAMPLER_SEED,
    FULL_TARGET_CASES,
    HEAD_CONFIGS,
    MAIN_HEAD_DIMS,
    MASKS,
    MHA_CONFIGS,
    ODD_HEAD_DIMS,
    SQUARE_PAIRS,
    WAVES_MASKS,
    WAVES_SHAPE,
    FullGrid,
    _all_pairs,
    full,
    full_for,
    full_grid_for,
    waves_for,
)
from harness.core.grid_mods import mods

if TYPE_CHECKING:
    from harness.core.candidate import Candidate


def smoke() -> list[Case]:
    """Fewer than 40 small cases, seconds on a GPU: every mask kind in both dtypes at a
    non-square shape (113 x 203), Nq > Nk under both causal alignments (fully masked rows
    under bottom-right), GQA and MQA, d = 128, decode-like 1 and 3 query rows, odd head dims
    40 and 96, a key-padding batch with an empty entry, and a 256 x 256 square."""
    cases = [Case(2, 4, 4, 113, 203, 64, dt, m) for dt in DTYPES for m in MASKS]
    cases += [
        Case(2, 4, 4, 203, 113, 64, "float16", MaskKind.CAUSAL_BR),
        Case(2, 4, 4, 203, 113, 64, "bfloat16", MaskKind.CAUSAL_TL),
        Case(1, 4, 4, 203, 113, 128, "float16", MaskKind.RANDOM),
        Case(2, 8, 2, 128, 128, 128, "float16", MaskKind.NONE),
        Case(1, 4, 1, 64, 97, 128, "bfloat16", MaskKind.CAUSAL_BR),
        Case(2, 6, 2, 97, 64, 64, "float16", MaskKind.KEY_PADDING),
        Case(1, 4, 4, 256, 256, 128, "float16", MaskKind.NONE),
        Case(1, 4, 4, 256, 256, 128, "bfloat16", MaskKind.CAUSAL_BR),
        Case(2, 4, 4, 256, 256, 64, "float16", MaskKind.CAUSAL_TL),
        Case(1, 8, 2, 1, 239, 128, "float16", MaskKind.KEY_PADDING),
        Case(2, 4, 4, 3, 799, 64, "bfloat16", MaskKind.CAUSAL_BR),
        Case(1, 4, 4, 1, 1, 64, "float16", MaskKind.NONE),
        Case(3, 4, 4, 128, 217, 64, "float16", MaskKind.KEY_PADDING),
        Case(1, 4, 4, 113, 203, 40, "float16", MaskKind.NONE),
        Case(1, 4, 2, 217, 128, 96, "bfloat16", MaskKind.CAUSAL_BR),
    ]
    return cases


def own_grid(grid: str, candidate: Candidate) -> FullGrid:
    """The cases of `grid` that `candidate` runs, and why none where it runs none: the
    per-candidate `full_grid_for` for the full grid, the named grid otherwise (whose
    cases a candidate refuses are skipped with the reason, case by case)."""
    if grid == "full":
        return full_grid_for(candidate)
    return FullGrid(get_grid(grid))


def cases_for(grid: str, candidate: Candidate) -> list[Case]:
    """The cases of `grid` that `candidate` runs (`own_grid`)."""
    return own_grid(grid, candidate).cases


PERF_TOKENS = 16384
PERF_MODEL_DIM = 2048


def perf() -> list[Case]:
    """The throughput grid (48 cases), the layout of FlashAttention's benchmarks and of the
    peer baseline: B * N = 16384 tokens, heads = 2048 / d, N = 512 ... 16384 (powers of
    two), d in {64, 128}, causal (bottom-right; Nq = Nk so both alignments agree) or not,
    fp16 and bf16."""
    cases = []
    for dtype in DTYPES:
        for d in MAIN_HEAD_DIMS:
            heads = PERF_MODEL_DIM // d
            for n in (512, 1024, 2048, 4096, 8192, 16384):
                for mask in (MaskKind.NONE, MaskKind.CAUSAL_BR):
                    cases.append(Case(PERF_TOKENS // n, heads, heads, n, n, d, dtype, mask))
    return cases


# The larger head dims of today's models, timed: d = 192 and 256, and d_qk = 192 with
# d_v = 128 (an MLA prefill's), as (d_qk, d_v).
PERF_DIMS = ((192, 192), (256, 256), (192, 128))
PERF_DIMS_SEQLENS = (1024, 4096, 16384)


def perf_dims() -> list[Case]:
    """The larger head dims' throughput grid (36 cases): the perf grid's layout (B * N =
    16384 tokens, heads = 2048 // d_qk, causal bottom-right or not, fp16 and bf16) at
    N = 1k, 4k, 16k for d = 192, 256 and d_qk = 192 / d_v = 128. Timed when named (not
    one of the gate's default grids)."""
    cases = []
    for dtype in DTYPES:
        for dqk, dv in PERF_DIMS:
            heads = PERF_MODEL_DIM // dqk
            for n in PERF_DIMS_SEQLENS:
                for mask in (MaskKind.NONE, MaskKind.CAUSAL_BR):
                    cases.append(Case(PERF_TOKENS // n, heads, heads, n, n, dqk, dtype, mask,
                                      head_dim_v=dv))
    return cases


PERF_BWD_SEQLENS = (1024, 2048, 4096, 8192, 16384)


def perf_bwd() -> list[Case]:
    """The backward's throughput grid (40 cases): the perf grid's layout (B * N = 16384
    tokens, heads = 2048 / d, causal bottom-right or not, fp16 and bf16, d in {64, 128})
    at N = 1k ... 16k. Its cases are run through the candidates' backward
    (`GRID_PASS`)."""
    cases = []
    for dtype in DTYPES:
        for d in MAIN_HEAD_DIMS:
            heads = PERF_MODEL_DIM // d
            for n in PERF_BWD_SEQLENS:
                for mask in (MaskKind.NONE, MaskKind.CAUSAL_BR):
                    cases.append(Case(PERF_TOKENS // n, heads, heads, n, n, d, dtype, mask))
    return cases


DECODE_SEQLENS_K = (1024, 8192, 32768, 65536, 131072)
# The serving forms of the decode grid: Nk at which paged and varlen decode are timed, the
# page sizes, and the batch of a varlen decode batch (caches of mixed lengths).
DECODE_SERVING_SEQLENS_K = (8192, 65536, 131072)
DECODE_PAGE_SIZES = (64, 256)
DECODE_VARLEN_BATCH = 8


def decode() -> list[Case]:
    """The decoding grid (80 cases): one query row (Nq = 1), 32 query heads with 8 (GQA)
    or 32 (MHA) K/V heads, d = 128, fp16 and bf16: bandwidth-bound reads of the KV cache,
    where split-KV matters. Contiguous caches of batch 1 at Nk in {1k, 8k, 32k, 64k, 128k};
    then at Nk in {8k, 64k, 128k} the same caches paged (pages of 64 and 256 keys, every
    sequence at full length, so a paged case compares with the contiguous one of its
    shape) and a varlen decode batch of 8 caches of mixed lengths (empty, single-key, odd
    and full ones). Then the long caches in float8 e4m3 (DECODE_FP8: docs/fp8.md), each
    the twin of a case above: contiguous ones at 64k and 128k with per-head and per-token
    descales, and those paged in pages of 64 with per-token descales."""
    cases = [Case(1, 32, kv, 1, nk, 128, dtype, MaskKind.NONE)
             for dtype in DTYPES for kv in (8, 32) for nk in DECODE_SEQLENS_K]
    for dtype in DTYPES:
        for kv in (8, 32):
            for nk in DECODE_SERVING_SEQLENS_K:
                cases += [Case(1, 32, kv, 1, nk, 128, dtype, layout=Layout.PAGED, page_size=ps,
                               full_lengths=True) for ps in DECODE_PAGE_SIZES]
                cases.append(Case(DECODE_VARLEN_BATCH, 32, kv, 1, nk, 128, dtype,
                                  layout=Layout.VARLEN))
    twins = [dataclasses.replace(c, fp8=fp8) for c in cases if c.seqlen_k in DECODE_FP8_SEQLENS_K
             for fp8 in DECODE_FP8.get((c.layout, c.page_size), ())]
    return cases + twins


# The e4m3 twins of the decode grid: (layout, page size) -> descale granularities, at
# these cache lengths.
DECODE_FP8_SEQLENS_K = (65536, 131072)
DECODE_FP8: dict[tuple[Layout, int], tuple[Fp8, ...]] = {
    (Layout.DENSE, 0): (Fp8.KV_HEAD, Fp8.KV_TOKEN), (Layout.PAGED, 64): (Fp8.KV_TOKEN,)}


# Sliding windows (left, right) the serving grid meets: causal-style (left only), a
# single key, two-sided, right only, and left only without a causal mask.
SERVING_WINDOWS = ((32, 0), (0, 0), (64, 16), (-1, 8), (100, -1))
SERVING_PAIRS = ((113, 203), (203, 113), (64, 64), (1, 239), (128, 217), (97, 1))
SERVING_PAGED = ((1, 239, 16), (3, 799, 64), (16, 1024, 256), (1, 300, 32), (64, 97, 16))


def serving_grid() -> list[Case]:
    """Serving shapes (harness.core.serving), about 120 cases: varlen batches (mixed
    lengths: empty, single-row, odd and full sequences, padding between them) over every
    pair of SERVING_PAIRS and mask kind none / causal either alignment; paged caches
    (pages of 16 to 256 keys, shuffled, partial and shared pages) for decode-like and
    short prefill queries; sliding windows on dense, varlen and paged cases, with both
    alignments and GQA/MQA. dtype, head dim (64, 128) and head layout cycle."""
    masks = (MaskKind.NONE, MaskKind.CAUSAL_BR, MaskKind.CAUSAL_TL)
    dt_dims = [(dt, d) for d in MAIN_HEAD_DIMS for dt in DTYPES]
    cases: list[Case] = []
    j = 0

    def add(batch: int, nq: int, nk: int, mask: MaskKind, **kw) -> None:
        nonlocal j
        dtype, d = dt_dims[j % len(dt_dims)]
        heads, kv = HEAD_CONFIGS[(j // len(dt_dims)) % len(HEAD_CONFIGS)]
        j += 1
        cases.append(Case(batch, heads, kv, nq, nk, d, dtype, mask, **kw))

    for nq, nk in SERVING_PAIRS:
        for mask in masks:
            add(6 if nq * nk < 30_000 else 3, nq, nk, mask, layout=Layout.VARLEN)
    for nq, nk, ps in SERVING_PAGED:
        for mask in masks:
            add(5, nq, nk, mask, layout=Layout.PAGED, page_size=ps)
    for wl, wr in SERVING_WINDOWS:
        for mask in masks:
            if mask.is_causal and wr > 0:
                continue  # a right extent past the diagonal is hidden by the causal mask
            for nq, nk in ((113, 203), (203, 113), (256, 256)):
                add(2, nq, nk, mask, window_left=wl, window_right=wr)
            add(5, 97, 211, mask, window_left=wl, window_right=wr, layout=Layout.VARLEN)
            add(4, 3, 500, mask, window_left=wl, window_right=wr, layout=Layout.PAGED,
                page_size=64)
    return cases


GRIDS: dict[str, Callable[[], list[Case]]] = {
    "smoke": smoke, "full": full, "perf": perf, "decode": decode, "perf-bwd": perf_bwd,
    "serving": serving_grid, "mods": mods, "perf-dims": perf_dims,
}
# The pass a grid's cases are run through: "fwd" unless named here.
GRID_PASS: dict[str, str] = {"perf-bwd": "bwd"}
# Grids whose cases are timed (the others are correctness only).
TIMING_GRIDS = ("perf", "decode", "perf-bwd", "perf-dims")


def grid_pass(name: str) -> str:
    return GRID_PASS.get(name, "fwd")


def get_grid(name: str) -> list[Case]:
    """The cases of grid `name`; ValueError naming the known grids otherwise."""
    try:
        return GRIDS[name]()
    except KeyError:
        raise ValueError(f"unknown grid {name!r}; known: {', '.join(GRIDS)}") from None
