"""The named grids: sizes, coverage and determinism."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.core.cases import Fp8, Layout, MaskKind, make_inputs
from harness.core.grids import ANCHOR_PAIRS, GRIDS, ODD_HEAD_DIMS, get_grid
from harness.core.reference import reference_for_case


def test_every_grid_is_deterministic_and_duplicate_free():
    for name in GRIDS:
        a, b = get_grid(name), get_grid(name)
        assert a == b and len(set(a)) == len(a), name
        assert len({c.id for c in a}) == len(a), name


def test_smoke_is_small_and_covers_the_basics():
    cases = get_grid("smoke")
    assert len(cases) < 40
    assert {c.mask for c in cases} == set(MaskKind)
    assert {c.dtype for c in cases} == {"float16", "bfloat16"}
    assert any(c.kv_heads == 1 for c in cases) and any(1 < c.kv_heads < c.heads for c in cases)
    assert any(c.seqlen_q > c.seqlen_k and c.mask is MaskKind.CAUSAL_BR for c in cases)


def test_full_grid_coverage():
    cases = get_grid("full")
    assert 150 <= len(cases) <= 300
    pairs = {(c.seqlen_q, c.seqlen_k) for c in cases}
    for a, b in ANCHOR_PAIRS:
        assert (a, b) in pairs and (b, a) in pairs
    assert {c.mask for c in cases} == set(MaskKind)
    assert {c.dtype for c in cases} == {"float16", "bfloat16"}
    dims = {c.head_dim for c in cases}
    assert {64, 128} <= dims and set(ODD_HEAD_DIMS) <= dims
    assert {c.group_size for c in cases} >= {1, 2, 4}  # MHA, GQA, MQA (4 heads, 1 kv)
    assert max(c.batch for c in cases) == 4
    assert any(c.seqlen_q > c.seqlen_k and c.mask is MaskKind.CAUSAL_BR for c in cases)
    # every (pair, mask) combination appears
    assert {(c.seqlen_q, c.seqlen_k, c.mask) for c in cases} == {
        (q, k, m) for q, k in pairs for m in MaskKind}


def test_full_grid_contains_fully_masked_rows():
    cases = [c for c in get_grid("full") if c.mask is MaskKind.CAUSAL_BR
             and c.seqlen_q > c.seqlen_k][:1]
    cases += [c for c in get_grid("full") if c.mask is MaskKind.KEY_PADDING and c.batch > 1][:1]
    for case in cases:
        _, lse = reference_for_case(case, make_inputs(case))
        assert torch.isneginf(lse).any(), case.id


def test_perf_and_decode_layouts():
    perf = get_grid("perf")
    assert len(perf) == 48
    for c in perf:
        assert c.batch * c.seqlen_q == 16384 and c.heads == 2048 // c.head_dim
        assert c.seqlen_q == c.seqlen_k and c.mask in (MaskKind.NONE, MaskKind.CAUSAL_BR)
    assert {c.seqlen_q for c in perf} == {512, 1024, 2048, 4096, 8192, 16384}
    decode = get_grid("decode")
    assert len(decode) == 80
    assert all(c.seqlen_q == 1 and c.heads == 32 and c.head_dim == 128 for c in decode)
    assert {c.kv_heads for c in decode} == {8, 32}
    assert max(c.seqlen_k for c in decode) == 131072
    dense = [c for c in decode if c.layout is Layout.DENSE and c.fp8 is Fp8.NONE]
    assert len(dense) == 20 and all(c.batch == 1 for c in dense)
    # Each e4m3 cache is the twin of a 2-byte case of the grid (its GB/s is set against it).
    fp8 = [c for c in decode if c.fp8 is not Fp8.NONE]
    assert len(fp8) == 24 and all(c.fp8.is_kv_cache and c.seqlen_k >= 65536 for c in fp8)
    assert {dataclasses.replace(c, fp8=Fp8.NONE) for c in fp8} <= set(decode)
    paged = [c for c in decode if c.layout is Layout.PAGED]
    # Every paged case has the contiguous case of its shape beside it (paged vs contiguous).
    assert paged and all(c.full_lengths and c.page_size >= 64 for c in paged)
    shapes = {(c.kv_heads, c.seqlen_k, c.dtype) for c in dense}
    assert all((c.kv_heads, c.seqlen_k, c.dtype) in shapes for c in paged)
    varlen = [c for c in decode if c.layout is Layout.VARLEN]
    assert varlen and all(c.batch == 8 and not c.full_lengths for c in varlen)


def test_serving_grid_holds_every_kind():
    cases = get_grid("serving")
    assert {c.layout for c in cases} == set(Layout)
    for layout in Layout:
        kinds = {c.mask for c in cases if c.layout is layout}
        assert {MaskKind.NONE, MaskKind.CAUSAL_BR, MaskKind.CAUSAL_TL} <= kinds
        assert any(c.has_window for c in cases if c.layout is layout)
    assert {c.page_size for c in cases if c.layout is Layout.PAGED} >= {16, 64, 256}
    assert any(c.kv_heads < c.heads for c in cases if c.has_window)
    assert len(cases) == len(set(cases))


def test_unknown_grid_names_the_known_ones():
    with pytest.raises(ValueError, match="smoke, full, perf, decode"):
        get_grid("fast")
