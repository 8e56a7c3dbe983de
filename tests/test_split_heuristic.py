"""The split count of the split-KV CUDA kernel (harness.candidates.split_heuristic), on
the CPU: it fills the SMs, never splits past the chunks, leaves enough parallelism
unsplit, stays within one wave for equal lengths, and splits a mixed-length batch for
its longest cache."""

from __future__ import annotations

import math

import pytest

from harness.candidates.cuda_candidate import CudaVariant
from harness.candidates.split_heuristic import MAX_SPLITS, choose_splits, splitkv_work
from harness.candidates.variants import KERNELS_ROOT, load_variant_dir
from harness.core.cases import Case, Layout, MaskKind
from harness.core.grids import decode, serving_grid
from harness.core.serving import placement

SLOTS = 132 * 2  # an H200 at two CTAs per SM


def _ctas(work: list[tuple[int, int]], splits: int) -> int:
    return sum(b for b, c in work if b and c) * splits


def _longest_piece(work: list[tuple[int, int]], splits: int) -> int:
    return max(math.ceil(c / splits) for b, c in work if b and c)


@pytest.mark.parametrize("blocks", [1, 8, 32, 64, 100, 131])
def test_fills_the_slots_in_one_wave(blocks):
    work = [(blocks, 2048)]
    s = choose_splits(work, SLOTS)
    assert _ctas(work, s) <= SLOTS  # equal pieces: never a partial second wave
    # as many as fit (within the split cap): the next count would not fit
    assert s == min(MAX_SPLITS, SLOTS // blocks)
    assert _ctas(work, s + 1) > SLOTS or s == MAX_SPLITS


def test_decode_shapes_fill_the_h200():
    assert choose_splits([(8, 2048)], SLOTS) == 33   # b1 h32 kv8, Nk = 128k: 264 CTAs
    assert choose_splits([(32, 2048)], SLOTS) == 8   # kv32: 256 CTAs, not 288 (two waves)
    for blocks in (8, 32):
        assert _ctas([(blocks, 1024)], choose_splits([(blocks, 1024)], SLOTS)) >= 0.9 * SLOTS


def test_one_split_when_there_is_enough_parallelism():
    assert choose_splits([(SLOTS, 4096)], SLOTS) == 1
    assert choose_splits([(8, 100)] * 64, SLOTS) == 1  # 512 blocks of equal work
    assert choose_splits([(200, 4096)], SLOTS) == 1    # a second wave of splits: worse


def test_never_more_splits_than_chunks():
    for chunks in (1, 2, 5, 17):
        assert choose_splits([(1, chunks)], SLOTS) == chunks
    assert choose_splits([(1, 10**6)], SLOTS) == MAX_SPLITS
    assert choose_splits([(1, 10**6)], SLOTS, max_splits=7) == 7


def test_mixed_lengths_split_for_the_longest():
    """A varlen decode batch: one long cache among short ones. Splitting for the number of
    blocks alone would leave the long cache's blocks running far past the rest."""
    work = [(8, 2048)] + [(8, 64)] * 7
    s = choose_splits(work, SLOTS)
    total = sum(b * c for b, c in work)
    fair = math.ceil(total / SLOTS)
    assert _longest_piece(work, s) <= fair + 1
    assert _longest_piece(work, s - 1) > fair  # fewer splits: the long cache dominates
    # 64 blocks fill only a quarter of the slots but the work is uneven: more than 4
    assert s > SLOTS // 64


def test_sequences_without_work_count_nothing():
    assert choose_splits([], SLOTS) == 1
    assert choose_splits([(0, 0), (8, 0)], SLOTS) == 1
    assert choose_splits([(8, 2048), (0, 0)], SLOTS) == choose_splits([(8, 2048)], SLOTS)


def test_bad_input_is_one_message():
    with pytest.raises(ValueError, match="slots"):
        choose_splits([(1, 1)], 0)
    with pytest.raises(ValueError, match="negative"):
        choose_splits([(-1, 1)], SLOTS)
    with pytest.raises(ValueError, match="block_rows"):
        splitkv_work(Case(1, 4, 4, 1, 64, 64), 0, 64)


def test_work_of_a_case():
    dense = Case(2, 32, 8, 1, 131072, 128)
    assert splitkv_work(dense, 16, 64) == [(8, 2048)] * 2
    gqa8 = Case(1, 16, 2, 3, 799, 64, "bfloat16", MaskKind.CAUSAL_BR)  # 24 rows per kv head
    assert splitkv_work(gqa8, 16, 64) == [(2 * 2, math.ceil(799 / 64))]
    varlen = Case(8, 32, 8, 1, 65536, 128, layout=Layout.VARLEN)
    pl = placement(varlen)
    work = splitkv_work(varlen, 16, 64)
    for (blocks, chunks), q, k in zip(work, pl.q_lens, pl.k_lens, strict=True):
        assert (blocks, chunks) == ((0, 0) if q == 0 or k == 0 else (8, math.ceil(k / 64)))
    # a sliding window of 32 keys behind a single query row: one chunk, one of slack
    window = Case(1, 4, 4, 1, 10_000, 64, window_left=32, window_right=0)
    assert splitkv_work(window, 16, 64) == [(4, 2)]


def test_the_variant_uses_it():
    cand = CudaVariant.from_spec(load_variant_dir(KERNELS_ROOT / "splitkv"))
    tiles = cand.spec.tiles
    for case in decode() + [c for c in serving_grid() if cand.supports(c) is None]:
        work = splitkv_work(case, tiles["block_rows"], tiles["block_k"])
        n = cand.resolve_num_splits(case, 132)
        assert n == choose_splits(work, 132 * tiles["ctas_per_sm"])
        assert 1 <= n <= max([c for _, c in work] + [1])
