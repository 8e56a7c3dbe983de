"""FLOPs from the visible pairs of the actual mask."""

from __future__ import annotations

import pytest
import torch

from harness.core.cases import Case, MaskKind, make_inputs, visible
from harness.core.flops import attention_flops, causal_pairs, visible_pairs


def brute_pairs(nq: int, nk: int, offset: int) -> int:
    return sum(1 for i in range(nq) for j in range(nk) if j <= i + offset)


@pytest.mark.parametrize("nq,nk", [(1, 1), (5, 5), (3, 11), (11, 3), (1, 239), (239, 1),
                                   (113, 203), (203, 113)])
def test_causal_closed_form_matches_brute_force(nq, nk):
    for offset in (0, nk - nq, -5, nk + 3):
        assert causal_pairs(nq, nk, offset) == brute_pairs(nq, nk, offset)


def test_non_square_causal_flops_exact():
    br = Case(2, 3, 3, 203, 113, 64, mask=MaskKind.CAUSAL_BR)  # offset -90: 90 empty rows
    tl = Case(2, 3, 3, 203, 113, 64, mask=MaskKind.CAUSAL_TL)
    assert visible_pairs(br) == 6 * brute_pairs(203, 113, -90)
    assert visible_pairs(tl) == 6 * brute_pairs(203, 113, 0)
    assert attention_flops(br) == 4 * 64 * 6 * (113 * 114 // 2)
    # square causal: N(N+1)/2 pairs, the "halved" count plus the diagonal
    sq = Case(1, 1, 1, 4096, 4096, 64, mask=MaskKind.CAUSAL_BR)
    assert attention_flops(sq) == 4 * 64 * 4096 * 4097 // 2
    assert attention_flops(Case(1, 1, 1, 4096, 4096, 64)) == 4 * 4096 ** 2 * 64


@pytest.mark.parametrize("kind", [MaskKind.KEY_PADDING, MaskKind.RANDOM, MaskKind.CAUSAL_BR])
def test_mask_counts_match_the_visibility_tensor(kind):
    case = Case(3, 4, 2, 37, 29, 16, mask=kind)
    inp = make_inputs(case)
    vis = visible(case, inp)
    expect = int(vis.expand(3, 1, 37, 29).sum()) * case.heads
    assert visible_pairs(case, inp) == expect
    assert visible_pairs(case) == expect  # the same seeded draw without given inputs
    assert attention_flops(case, inp) == 4 * 16 * expect
    assert expect < 3 * 4 * 37 * 29


def test_per_head_mask_is_counted_per_head():
    case = Case(1, 2, 2, 4, 4, 8, mask=MaskKind.RANDOM)
    inp = make_inputs(case)
    inp.mask = torch.zeros(1, 2, 4, 4, dtype=torch.bool)
    inp.mask[0, 1, 0, :3] = True
    assert visible_pairs(case, inp) == 3
