"""The float64 oracle and the same-precision naive implementation."""

from __future__ import annotations

import math

import pytest
import torch

from harness.core import reference as R
from harness.core.cases import Case, MaskKind, make_inputs


def direct(q, k, v, vis=None, scale=None):
    """Unblocked float64 attention written out the textbook way, K/V heads repeated."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = q @ k.transpose(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    if vis is not None:
        s = s.masked_fill(~vis, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v, lse


def rand(b, h, hkv, nq, nk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, nq, d, generator=g), torch.randn(b, hkv, nk, d, generator=g),
            torch.randn(b, hkv, nk, d, generator=g))


@pytest.mark.parametrize("nq,nk", [(7, 13), (13, 7), (1, 5), (16, 16)])
@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
def test_causal_both_alignments_match_direct(nq, nk, align):
    q, k, v = rand(2, 4, 2, nq, nk, 8)
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    offset = nk - nq if align == "bottom_right" else 0
    vis = j <= i + offset
    out, lse = R.attention_ref(q, k, v, causal=True, causal_align=align, block_rows=3)
    want_out, want_lse = direct(q, k, v, vis)
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    live = ~torch.isneginf(want_lse)
    torch.testing.assert_close(lse[live], want_lse[live], rtol=1e-12, atol=1e-12)
    assert torch.equal(torch.isneginf(lse), ~live)


def test_alignments_differ_when_lengths_differ():
    q, k, v = rand(1, 1, 1, 4, 9, 8)
    br, _ = R.attention_ref(q, k, v, causal=True, causal_align="bottom_right")
    tl, _ = R.attention_ref(q, k, v, causal=True, causal_align="top_left")
    assert not torch.allclose(br, tl)
    with pytest.raises(ValueError, match="causal_align"):
        R.attention_ref(q, k, v, causal=True, causal_align="bottom-right")


def test_fully_masked_rows_are_exactly_zero_with_lse_minus_inf():
    # Nq > Nk bottom-right: rows 0 .. Nq-Nk-1 see no key.
    q, k, v = rand(1, 2, 2, 10, 4, 8)
    out, lse = R.attention_ref(q, k, v, causal=True)
    assert torch.equal(out[:, :, :6], torch.zeros_like(out[:, :, :6]))
    assert torch.isneginf(lse[:, :, :6]).all() and torch.isfinite(lse[:, :, 6:]).all()
    nout, nlse = R.attention_naive(q.half(), k.half(), v.half(), causal=True)
    assert torch.equal(nout[:, :, :6], torch.zeros_like(nout[:, :, :6]))
    assert torch.isneginf(nlse[:, :, :6]).all()
    assert not torch.isnan(nout).any()


def test_gqa_and_mask_match_direct():
    q, k, v = rand(2, 6, 2, 11, 17, 16, seed=3)
    mask = torch.rand(2, 6, 11, 17, generator=torch.Generator().manual_seed(1)) < 0.5
    mask[:, :, 4] = False
    out, lse = R.attention_ref(q, k, v, mask=mask, block_rows=4, scale=0.3)
    want_out, want_lse = direct(q, k, v, mask, scale=0.3)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    assert (out[:, :, 4] == 0).all() and torch.isneginf(lse[:, :, 4]).all()
    # A (B, 1, 1, Nk) key-padding style mask broadcasts over heads and rows.
    kp = torch.zeros(2, 1, 1, 17, dtype=torch.bool)
    kp[..., :5] = True
    out, _ = R.attention_ref(q, k, v, mask=kp)
    torch.testing.assert_close(out, direct(q, k, v, kp.expand(2, 6, 11, 17))[0])


def test_blocking_does_not_change_the_result():
    q, k, v = rand(1, 2, 1, 37, 23, 8)
    a, la = R.attention_ref(q, k, v, causal=True, block_rows=1)
    b, lb = R.attention_ref(q, k, v, causal=True, block_rows=1000)
    # Not bitwise: the BLAS may order sums differently for different block shapes.
    torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(la, lb, rtol=1e-13, atol=1e-13)


def test_block_size_for_long_sequences_stays_within_budget():
    # The perf grid's longest case: B = 1, H = 16, N = 16384, d = 128.
    rows = R.block_rows_for(1, 16, 16384)
    assert 1 <= rows < 16384
    ws = R.block_working_set_bytes(1, 16, 16384, rows)
    assert ws <= R.REF_BUDGET_BYTES
    # Inputs upcast once + output: 4 x 268 MiB; the whole thing stays within a few GB.
    total = ws + 4 * 16 * 16384 * 128 * 8
    assert total < 2 * 2**30
    # Without blocking, the score matrix alone would take 32 GiB.
    assert 16 * total < 16 * 16384 * 16384 * 8


def test_naive_tracks_reference_at_input_precision():
    case = Case(2, 4, 2, 65, 130, 64, "bfloat16", MaskKind.RANDOM)
    inp = make_inputs(case)
    ref_out, ref_lse = R.reference_for_case(case, inp)
    out, lse = R.naive_for_case(case, inp)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    err = (out.double() - ref_out).abs().max().item()
    assert 0 < err < 0.05  # bf16 rounding, not exact, not wrong
    live = ~torch.isneginf(ref_lse)
    assert (lse.double() - ref_lse)[live].abs().max() < 0.05


def test_case_flags_follow_the_mask_kind():
    for kind, causal in [(MaskKind.CAUSAL_BR, "bottom_right"), (MaskKind.CAUSAL_TL, "top_left")]:
        case = Case(1, 1, 1, 3, 5, 8, mask=kind)
        assert R.case_flags(case, make_inputs(case))["causal_align"] == causal
    case = Case(2, 1, 1, 3, 5, 8, mask=MaskKind.KEY_PADDING)
    flags = R.case_flags(case, make_inputs(case))
    assert flags["causal"] is False and flags["mask"] is not None


def test_bad_shapes_are_rejected():
    q, k, v = rand(1, 3, 2, 4, 4, 8)
    with pytest.raises(ValueError, match="divisible"):
        R.attention_ref(q, k, v)
