"""The full grid generated per candidate: a narrow kernel gets as many cases as a broad
one, every combination it declares is reached, and the count stays bounded."""

from __future__ import annotations

import itertools

import pytest

from harness.candidates.registry import get_candidate
from harness.core.candidate import Candidate, Support
from harness.core.cases import MaskKind
from harness.core.grids import (
    FULL_TARGET_CASES,
    _all_pairs,
    cases_for,
    full_for,
    get_grid,
    waves_for,
)


class Declares(Candidate):
    def __init__(self, **support):
        super().__init__(name="declares", kind="model", device="cpu",
                         support=Support(**support))

    def run(self, case, inputs, out, lse) -> None:  # never run here
        raise AssertionError


BROAD = Declares()
NARROW = Declares(dtypes=frozenset({"float16"}), head_dims=frozenset({64}),
                  masks=frozenset({MaskKind.CAUSAL_BR}), gqa=False)
FP16_D64 = Declares(dtypes=frozenset({"float16"}), head_dims=frozenset({64}))


@pytest.mark.parametrize("cand,expect", [(BROAD, 200), (FP16_D64, 200), (NARROW, 161)])
def test_counts(cand, expect):
    cases = full_for(cand)
    assert len(cases) == expect
    assert len(set(cases)) == len(cases)
    assert all(cand.supports(c) is None for c in cases)


def test_a_narrow_kernel_gets_far_more_than_the_shared_grid_gave_it():
    shared = [c for c in get_grid("full") if FP16_D64.supports(c) is None]
    assert len(shared) < 30
    assert len(full_for(FP16_D64)) >= 6 * len(shared)


@pytest.mark.parametrize("cand", [BROAD, FP16_D64, NARROW])
def test_every_pair_meets_every_declared_mask(cand):
    cases = full_for(cand)
    masks = [m for m in MaskKind if m in cand.support.masks]
    assert {(c.seqlen_q, c.seqlen_k, c.mask) for c in cases} == {
        (q, k, m) for (q, k), m in itertools.product(_all_pairs(), masks)}


def test_broad_kernel_reaches_every_dtype_dim_and_layout():
    cases = full_for(BROAD)
    assert {(c.dtype, c.head_dim) for c in cases} == {
        (dt, d) for dt in ("float16", "bfloat16") for d in (64, 128, 40, 59, 96, 111)}
    assert {(c.heads, c.kv_heads) for c in cases} == {(4, 4), (4, 2), (6, 2), (4, 1)}
    assert {c.batch for c in cases} == {1, 2, 4}
    assert len(cases) <= FULL_TARGET_CASES


def test_mha_only_kernel_gets_head_count_variation():
    cases = full_for(NARROW)
    assert all(c.heads == c.kv_heads for c in cases)
    assert {c.heads for c in cases} == {2, 4, 8}


def test_shipped_models_get_their_own_grids():
    a = get_candidate("fa2_model")
    assert cases_for("full", a) == full_for(a)
    assert cases_for("smoke", a) == get_grid("smoke")
    assert full_for(a) == full_for(a)  # deterministic


class OnGpu(Declares):
    def __init__(self, **support):
        super().__init__(**support)
        self.device = "cuda"


def _blocks(case, rows=128):
    return -(-case.seqlen_q // rows) * case.heads * case.batch


def test_a_gpu_candidate_gets_cases_past_two_waves_of_its_ctas():
    gpu = OnGpu()
    waves = waves_for(gpu)
    assert full_for(gpu) == full_for(BROAD) + waves
    assert [(c.mask, c.head_dim) for c in waves] == [
        (m, d) for m in (MaskKind.CAUSAL_BR, MaskKind.KEY_PADDING, MaskKind.NONE) for d in (128, 64)]
    # every CTA of a persistent kernel on a 132-SM GPU takes two or more 128-row blocks
    assert all(_blocks(c) > 2 * 132 for c in waves)
    # the rest of the grid never gets there
    assert max(_blocks(c) for c in full_for(BROAD)) < 2 * 132
    # both dtypes at each head dim, GQA since it declares GQA
    assert {(c.dtype, c.head_dim) for c in waves} == {
        (dt, d) for dt in ("float16", "bfloat16") for d in (64, 128)}
    assert all(c.kv_heads < c.heads for c in waves)


def test_the_waves_put_blocks_without_keys_between_blocks_with_work():
    import torch

    from harness.core.cases import key_lengths_for, make_inputs, visible

    causal, _, padded, _, _, _ = waves_for(OnGpu())
    inputs = make_inputs(causal, "cpu")
    vis = visible(causal, inputs)
    seen_per_block = [bool(vis[..., r:r + 128, :].any()) for r in range(0, causal.seqlen_q, 128)]
    assert seen_per_block == [False, True, True]   # the first block of every head is empty
    lengths = key_lengths_for(padded, torch.Generator().manual_seed(0))
    assert lengths[-1] == 0 and lengths[0] == padded.seqlen_k


def test_cpu_candidates_and_narrow_gpu_candidates_get_only_what_they_run():
    assert waves_for(BROAD) == []   # a CPU candidate: no CTAs, seconds per case
    narrow = OnGpu(dtypes=frozenset({"bfloat16"}), head_dims=frozenset({64}),
                   masks=frozenset({MaskKind.NONE, MaskKind.KEY_PADDING}), gqa=False)
    waves = waves_for(narrow)
    assert [c.mask for c in waves] == [MaskKind.KEY_PADDING, MaskKind.NONE]
    assert all(c.dtype == "bfloat16" and c.head_dim == 64 and c.kv_heads == c.heads
               for c in waves)
