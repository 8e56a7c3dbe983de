"""The adversarial `full` grid: the shared list (`full`) and the one generated per
candidate from what it declares (`full_grid_for`), with a GPU candidate's waves cases.

Kept apart from harness.core.grids (which re-exports every name here) so that each module
stays readable; nothing here imports grids, so either may be imported first.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.core.cases import Case, MaskKind

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

# The per-candidate full grid: about this many cases for every candidate, broad or narrow.
FULL_TARGET_CASES = 200
# Head layouts (heads, kv_heads) for a candidate without GQA: MHA at three head counts.
MHA_CONFIGS = ((2, 2), (4, 4), (8, 8))
# A candidate none of whose pairs has more query rows than this (Support's
# max_seqlen_q_decode default) is a decode kernel: its full grid also gets
# FULL_DECODE_PAIRS, one query row against long caches as the decode grid
# (harness.core.grids.decode) has them, so that it is checked on the shapes it exists
# for. The decode grid's longer caches (32k-128k keys) stay there: their float64 oracle
# on a CPU would take gigabytes. 4097 ends in a partial tile of every block size.
DECODE_MAX_SEQLEN_Q = 64
FULL_DECODE_PAIRS = ((1, 1024), (1, 4097), (1, 8192))
# Above this many keys a case also keeps batch * heads <= 8 (the decode pairs' caches).
FULL_LONG_KEYS = 4096
# The probe's head layout and batch: MHA, which every candidate runs.
_PROBE_HEADS, _PROBE_BATCH = 4, 1


def _all_pairs() -> list[tuple[int, int]]:
    pairs: list[tuple[int, int]] = []
    for a, b in ANCHOR_PAIRS + SQUARE_PAIRS:
        for p in ((a, b), (b, a)):
            if p not in pairs:
                pairs.append(p)
    return pairs


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


@dataclass(frozen=True)
class FullGrid:
    """A candidate's full grid, and when it is empty, why (one line)."""

    cases: list[Case] = field(default_factory=list)
    why_none: str | None = None


class _Prober:
    """`candidate.supports` on batch-1 MHA cases, keeping the first distinct reasons it
    gives (what an empty grid is explained with)."""

    def __init__(self, candidate: Candidate) -> None:
        self.candidate = candidate
        self.reasons: list[str] = []

    def runs(self, case: Case) -> bool:
        why = self.candidate.supports(case)
        if why is not None and len(self.reasons) < 2 and why not in self.reasons:
            self.reasons.append(why)
        return why is None

    def any_runs(self, pairs: Iterable[tuple[int, int]], masks: Iterable[MaskKind],
                 dtype_dims: Iterable[tuple[str, int]]) -> bool:
        # Short-circuits on the first case that runs: a broad candidate costs one probe
        # per question (some candidates' supports() runs the backend once per shape).
        dds, ms = list(dtype_dims), list(masks)
        return any(self.runs(Case(_PROBE_BATCH, _PROBE_HEADS, _PROBE_HEADS, nq, nk, d, dt, m))
                   for nq, nk in pairs for m in ms for dt, d in dds)


def full_grid_for(candidate: Candidate) -> FullGrid:
    """`full_for`'s cases, and why there are none when it has none (the fronts print it:
    a candidate is never dropped from the full grid in silence)."""
    support = candidate.support
    masks = [m for m in MASKS if m in support.masks]
    dts = [dt for dt in DTYPES if dt in support.dtypes]
    if not masks or not dts:
        return FullGrid(why_none=f"declares none of the grid's masks ({', '.join(m.value for m in MASKS)}) "
                                 f"or dtypes ({', '.join(DTYPES)})")
    probe = _Prober(candidate)
    # Probed first at a shape almost every kernel runs, then at every pair of the grid:
    # a dim or dtype is kept if it runs anywhere (a decode kernel refuses 64 x 64).
    regular = _all_pairs()
    probe_pairs = [(64, 64)] + [p for p in regular + list(FULL_DECODE_PAIRS) if p != (64, 64)]
    dtype_dims = [(dt, d) for d in MAIN_HEAD_DIMS + ODD_HEAD_DIMS for dt in dts
                  if probe.any_runs(probe_pairs, masks, [(dt, d)])]
    pairs = [p for p in regular if dtype_dims and probe.any_runs([p], masks, dtype_dims)]
    if all(nq <= DECODE_MAX_SEQLEN_Q for nq, _ in pairs) and dtype_dims:
        pairs += [p for p in FULL_DECODE_PAIRS if probe.any_runs([p], masks, dtype_dims)]
    masks = [m for m in masks if pairs and probe.any_runs(pairs, [m], dtype_dims)]
    cases = _sampled(probe, pairs, masks, dtype_dims,
                     HEAD_CONFIGS if support.gqa else MHA_CONFIGS) if masks else []
    if not cases:
        return FullGrid(why_none="it refuses every case of the grid it was asked about, "
                                 "e.g. " + "; ".join(probe.reasons or ["(no reason given)"]))
    return FullGrid(cases + waves_for(candidate))


def full_for(candidate: Candidate) -> list[Case]:
    """The `full` grid generated from what `candidate` declares (`candidate.supports`),
    with `waves_for(candidate)` after it.

    Every sequence-length pair it runs (ANCHOR_PAIRS, swapped, and SQUARE_PAIRS; and
    FULL_DECODE_PAIRS for a decode kernel, one whose pairs all have at most
    DECODE_MAX_SEQLEN_Q query rows) meets every mask kind it runs; each such (pair, mask)
    combination gets k cases, k chosen so that the grid holds about FULL_TARGET_CASES
    cases, cycling through every (dtype, head dim) it runs (head dims among 64, 128 and
    the odd 40, 59, 96, 111), head layouts (MHA, GQA 2 and 3, MQA when it supports GQA;
    else MHA with 2, 4, 8 heads) and batches 1, 2, 4. "Runs" is asked of
    `candidate.supports`, not only of its declaration: a dtype, head dim, pair or mask is
    kept if it runs with any of the others, and a case it refuses takes the next (dtype,
    head dim) in the cycle instead. A kernel that declares one dtype, one head dim and
    one mask gets as many cases as one that declares everything, and every combination
    it declares is reached; the count stays at most FULL_TARGET_CASES plus one round (and
    the waves' 6). Large pairs and long caches keep batch * heads <= 8, as in `full`.
    Deterministic: same candidate support, same list. Empty when it runs nothing of the
    grid (`full_grid_for` says why)."""
    return full_grid_for(candidate).cases


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


def _sampled(probe: _Prober, pairs: list[tuple[int, int]], masks: list[MaskKind],
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
                heads, kv = layouts[(j // nd) % nl]
                batch = BATCHES[(j // (nd * nl) + r) % len(BATCHES)]
                if nq * nk > FULL_BIG_PAIRS or nk > FULL_LONG_KEYS:
                    batch = min(batch, 2)
                    heads, kv = min(heads, 4), min(kv, 4)
                    if heads % kv:
                        kv = 2
                # Not every (dtype, dim) runs with every pair and mask: the next one in
                # the cycle that does stands in, so the combination is not lost.
                for t in range(nd):
                    dtype, d = dtype_dims[(j + t) % nd]
                    case = Case(batch, heads, kv, nq, nk, d, dtype, mask)
                    if case in seen:
                        break
                    if probe.runs(case):
                        seen.add(case)
                        cases.append(case)
                        break
    return cases
