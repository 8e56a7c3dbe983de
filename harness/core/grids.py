"""The named case grids: smoke, full, perf, decode, serving, mods, and the backward's
perf-bwd.

Every grid is a deterministic list (same order in every process, which pytest-xdist
needs). Inputs are drawn per case from the case id (harness.core.cases.derive_seed), so every
combination gets its own seeded draw and the `seed` field stays 0.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.core.cases import Case, Layout, MaskKind
from harness.core.grid_mods import mods

if TYPE_CHECKING:
    from harness.core.candidate import Candidate

DTYPES = ("float16", "bfloat16")
MASKS = tuple(MaskKind)

# Sequence-length pairs FlashAttention's own tests sweep (odd sizes, partial tiles, Nq > Nk
# and Nq < Nk, single-row decode-like queries), each also swapped, plus a few squares.
ANCHOR_PAIRS = ((113, 203), (128, 217), (108, 256), (256, 512), (512, 256), (1023, 1024),
                (1024, 1023), (1, 239), (3, 799), (127, 513))
SQUARE_PAIRS = ((1, 1), (64, 64), (97, 97))
MAIN_HEAD_DIMS = (64, 128)
# Odd head dims: only candidates declaring them run these (others skip with the reason).
ODD_HEAD_DIMS = (40, 59, 96, 111)
# (heads, kv_heads): MHA, GQA with groups of 2 and 3, MQA.
HEAD_CONFIGS = ((4, 4), (4, 2), (6, 2), (4, 1))
BATCHES = (1, 2, 4)
FULL_DRAWS_PER_COMBINATION = 2
FULL_SAMPLER_SEED = 20240611
# Above this many (query, key) pairs per head a full-grid case keeps batch * heads <= 8,
# so that the CPU models finish the grid in minutes.
FULL_BIG_PAIRS = 300_000
# Cases for GPU candidates with more row blocks than two waves of a 132-SM GPU (H100,
# H200): 96 heads x 3 blocks of 128 query rows (6 of 64), so a persistent kernel's CTA
# (one per SM, taking blocks from a counter) runs two or more in turn. The rest of the
# grid has at most 168 blocks of 128 rows, most cases under 20, so a CTA's second block,
# which inherits the first one's pipeline state, would otherwise go unchecked. Under a
# bottom-right causal mask the first block of every head sees no key (rows 0-183 of 384
# against 200 keys), and under key padding the last batch entry none: blocks with nothing
# to compute fall between blocks with work. (batch, heads, kv_heads with GQA, Nq, Nk).
WAVES_SHAPE = (4, 24, 8, 384, 200)
WAVES_MASKS = (MaskKind.CAUSAL_BR, MaskKind.KEY_PADDING, MaskKind.NONE)


def _all_pairs() -> list[tuple[int, int]]:
    pairs: list[tuple[int, int]] = []
    for a, b in ANCHOR_PAIRS + SQUARE_PAIRS:
        for p in ((a, b), (b, a)):
            if p not in pairs:
                pairs.append(p)
    return pairs


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


def full() -> list[Case]:
    """The adversarial grid (about 190 cases), in the spirit of FlashAttention's tests.

    Every sequence-length pair of ANCHOR_PAIRS (each also swapped) and SQUARE_PAIRS meets
    every mask kind FULL_DRAWS_PER_COMBINATION times; each of those combinations draws its
    dtype (fp16/bf16), head dim (64 and 128 half the time, else one of the odd dims 40, 59,
    96, 111), head layout (MHA, GQA 2 and 3, MQA) and batch (1, 2, 4) from a fixed-seed
    sampler, so the combinatorics are covered by a sampled subset instead of a product of
    ~10^4 cases. Nq > Nk with bottom-right causal gives fully masked rows, as do key padding
    (the last batch entry has no keys) and the random masks (every 7th row). Large pairs
    keep batch * heads <= 8 so the CPU models finish the grid in minutes."""
    rng = random.Random(FULL_SAMPLER_SEED)
    dims = MAIN_HEAD_DIMS * 2 + ODD_HEAD_DIMS
    cases: list[Case] = []
    for _ in range(FULL_DRAWS_PER_COMBINATION):
        for nq, nk in _all_pairs():
            for mask in MASKS:
                dtype = rng.choice(DTYPES)
                d = rng.choice(dims)
                heads, kv = rng.choice(HEAD_CONFIGS)
                batch = rng.choice(BATCHES)
                if nq * nk > FULL_BIG_PAIRS:
                    batch = min(batch, 2)
                    heads, kv = (4, kv) if kv in (1, 2, 4) else (4, 2)
                case = Case(batch, heads, kv, nq, nk, d, dtype, mask)
                if case not in cases:
                    cases.append(case)
    return cases


# The per-candidate full grid: about this many cases for every candidate, broad or narrow.
FULL_TARGET_CASES = 200
# Head layouts (heads, kv_heads) for a candidate without GQA: MHA at three head counts.
MHA_CONFIGS = ((2, 2), (4, 4), (8, 8))


def full_for(candidate: Candidate) -> list[Case]:
    """The `full` grid generated from what `candidate` declares (`candidate.supports`),
    with `waves_for(candidate)` after it.

    Every sequence-length pair it supports (ANCHOR_PAIRS, swapped, and SQUARE_PAIRS) meets
    every mask kind it supports; each such (pair, mask) combination gets k cases, k chosen so
    that the grid holds about FULL_TARGET_CASES cases, cycling through every (dtype, head
    dim) it supports (head dims among 64, 128 and the odd 40, 59, 96, 111), head layouts
    (MHA, GQA 2 and 3, MQA when it supports GQA; else MHA with 2, 4, 8 heads) and batches
    1, 2, 4. A kernel that declares one dtype, one head dim and one mask gets as many cases
    as one that declares everything, and every combination it declares is reached; the
    count stays at most FULL_TARGET_CASES plus one round (and the waves' 6). Large pairs
    keep batch * heads <= 8, as in `full`. Deterministic: same candidate support, same
    list."""
    support = candidate.support
    masks = [m for m in MASKS if m in support.masks]
    # Dims and pairs are probed with a case the candidate could otherwise run.
    probe = Case(1, 4, 4, 64, 64, 64, _first(support), masks[0] if masks else MaskKind.NONE)
    dims = [d for d in MAIN_HEAD_DIMS + ODD_HEAD_DIMS
            if candidate.supports(_with(probe, head_dim=d, dtype=_first(support))) is None]
    dtype_dims = [(dt, d) for d in dims for dt in DTYPES if dt in support.dtypes]
    layouts = HEAD_CONFIGS if support.gqa else MHA_CONFIGS
    pairs = [p for p in _all_pairs()
             if candidate.supports(_with(probe, seqlen_q=p[0], seqlen_k=p[1],
                                         dtype=_first(support),
                                         head_dim=dims[0] if dims else 64)) is None]
    if not pairs or not masks or not dtype_dims:
        return []
    return _sampled(candidate, pairs, masks, dtype_dims, layouts) + waves_for(candidate)


def waves_for(candidate: Candidate) -> list[Case]:
    """For a GPU candidate, WAVES_SHAPE under each mask of WAVES_MASKS it supports at each
    head dim of 64 and 128 it supports, the dtypes taken in turn; none for a CPU candidate,
    whose runs have no CTAs (and would spend seconds per case)."""
    if candidate.device != "cuda":
        return []
    batch, heads, kv, nq, nk = WAVES_SHAPE
    if not candidate.support.gqa:
        kv = heads
    cases: list[Case] = []
    for mi, mask in enumerate(WAVES_MASKS):
        for d in reversed(MAIN_HEAD_DIMS):
            for k in range(len(DTYPES)):
                dtype = DTYPES[(len(cases) + mi + k) % len(DTYPES)]
                case = Case(batch, heads, kv, nq, nk, d, dtype, mask)
                if candidate.supports(case) is None:
                    cases.append(case)
                    break
    return cases


def _sampled(candidate: Candidate, pairs: list[tuple[int, int]], masks: list[MaskKind],
             dtype_dims: list[tuple[str, int]], layouts: tuple[tuple[int, int], ...]
             ) -> list[Case]:
    """`full_for`'s sampled cases: k rounds over every (pair, mask), as its docstring says."""
    combos = len(pairs) * len(masks)
    per = max(1, -(-FULL_TARGET_CASES // combos))
    cases: list[Case] = []
    seen: set[Case] = set()
    nd, nl = len(dtype_dims), len(layouts)
    for r in range(per):
        for pi, (nq, nk) in enumerate(pairs):
            for mi, mask in enumerate(masks):
                if r > 0 and len(cases) >= FULL_TARGET_CASES:
                    return cases
                # Round r of a combination takes the r-th (dtype, dim, layout, batch) in a
                # mixed-radix count, started at an offset per combination, so rounds differ
                # and neighbouring combinations start at different places.
                j = r + pi * 7 + mi * 3
                dtype, d = dtype_dims[j % nd]
                heads, kv = layouts[(j // nd) % nl]
                batch = BATCHES[(j // (nd * nl) + r) % len(BATCHES)]
                if nq * nk > FULL_BIG_PAIRS:
                    batch = min(batch, 2)
                    heads, kv = min(heads, 4), min(kv, 4)
                    if heads % kv:
                        kv = 2
                case = Case(batch, heads, kv, nq, nk, d, dtype, mask)
                if case in seen or candidate.supports(case) is not None:
                    continue
                seen.add(case)
                cases.append(case)
    return cases


def _first(support) -> str:
    return sorted(support.dtypes)[0] if support.dtypes else "float16"


def _with(case: Case, **kw) -> Case:
    from dataclasses import replace

    return replace(case, **kw)


def cases_for(grid: str, candidate: Candidate) -> list[Case]:
    """The cases of `grid` that `candidate` runs: the per-candidate `full_for` for the full
    grid, the named grid otherwise."""
    return full_for(candidate) if grid == "full" else get_grid(grid)


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
    """The decoding grid (56 cases): one query row (Nq = 1), 32 query heads with 8 (GQA)
    or 32 (MHA) K/V heads, d = 128, fp16 and bf16: bandwidth-bound reads of the KV cache,
    where split-KV matters. Contiguous caches of batch 1 at Nk in {1k, 8k, 32k, 64k, 128k};
    then at Nk in {8k, 64k, 128k} the same caches paged (pages of 64 and 256 keys, every
    sequence at full length, so a paged case compares with the contiguous one of its
    shape) and a varlen decode batch of 8 caches of mixed lengths (empty, single-key, odd
    and full ones)."""
    cases = [Case(1, 32, kv, 1, nk, 128, dtype, MaskKind.NONE)
             for dtype in DTYPES for kv in (8, 32) for nk in DECODE_SEQLENS_K]
    for dtype in DTYPES:
        for kv in (8, 32):
            for nk in DECODE_SERVING_SEQLENS_K:
                cases += [Case(1, 32, kv, 1, nk, 128, dtype, layout=Layout.PAGED, page_size=ps,
                               full_lengths=True) for ps in DECODE_PAGE_SIZES]
                cases.append(Case(DECODE_VARLEN_BATCH, 32, kv, 1, nk, 128, dtype,
                                  layout=Layout.VARLEN))
    return cases


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
    "serving": serving_grid, "mods": mods,
}
# The pass a grid's cases are run through: "fwd" unless named here.
GRID_PASS: dict[str, str] = {"perf-bwd": "bwd"}
# Grids whose cases are timed (the others are correctness only).
TIMING_GRIDS = ("perf", "decode", "perf-bwd")


def grid_pass(name: str) -> str:
    return GRID_PASS.get(name, "fwd")


def get_grid(name: str) -> list[Case]:
    """The cases of grid `name`; ValueError naming the known grids otherwise."""
    try:
        return GRIDS[name]()
    except KeyError:
        raise ValueError(f"unknown grid {name!r}; known: {', '.join(GRIDS)}") from None
