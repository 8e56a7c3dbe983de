"""The backward oracle (harness.core.reference_grad) against two independent computations:
autograd through a float64 forward written here from scratch (K/V repeated per query head,
masks as tensors), and central finite differences of <out, dO>. Every mask kind, both
causal alignments, GQA and MQA, Nq != Nk, fully masked rows; and the same-precision naive
backward close to the oracle, as the tolerance rule's yardstick must be."""

from __future__ import annotations

import math

import pytest
import torch

from harness.core.cases import Case, MaskKind, make_grad_output, make_inputs
from harness.core.reference import case_flags
from harness.core.reference_grad import (
    attention_grad_naive,
    attention_grad_ref,
    grad_naive_for_case,
    grad_reference_for_case,
)

M = MaskKind
CASES = [
    Case(2, 4, 4, 13, 21, 16, "float16", M.NONE),
    Case(2, 4, 2, 21, 13, 16, "float16", M.CAUSAL_BR),  # Nq > Nk: fully masked rows
    Case(1, 4, 1, 9, 17, 8, "bfloat16", M.CAUSAL_TL),  # MQA
    Case(3, 6, 2, 11, 19, 16, "float16", M.KEY_PADDING),  # a batch entry with no key
    Case(2, 4, 4, 15, 15, 8, "bfloat16", M.RANDOM),  # every 7th row fully masked
]


def _visibility(case: Case, mask: torch.Tensor | None) -> torch.Tensor:
    nq, nk = case.seqlen_q, case.seqlen_k
    vis = torch.ones(case.batch, case.heads, nq, nk, dtype=torch.bool)
    if case.mask.is_causal:
        off = nk - nq if case.mask is M.CAUSAL_BR else 0
        vis &= torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + off
    if mask is not None:
        vis &= mask.bool()
    return vis


def _forward64(case: Case, q, k, v, vis) -> torch.Tensor:
    """Softmax attention in float64, written independently of the oracle: K and V
    repeated per query head, masked pairs out of the softmax, fully masked rows 0."""
    g = case.heads // case.kv_heads
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(case.head_dim)
    s = s.masked_fill(~vis, float("-inf"))
    m = s.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    denom = e.sum(dim=-1, keepdim=True)
    return (e / torch.where(denom > 0, denom, torch.ones_like(denom))) @ v


def _inputs64(case: Case):
    inp = make_inputs(case)
    do = make_grad_output(case)
    return inp, do, _visibility(case, inp.mask)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_oracle_is_autograd_through_a_float64_forward(case):
    inp, do, vis = _inputs64(case)
    q, k, v = (t.double().requires_grad_() for t in (inp.q, inp.k, inp.v))
    out = _forward64(case, q, k, v, vis)
    out.backward(do.double())
    dq, dk, dv = grad_reference_for_case(case, inp, do)
    assert dq.dtype == torch.float64 and dk.shape == inp.k.shape and dv.shape == inp.v.shape
    for name, got, want in (("dq", dq, q.grad), ("dk", dk, k.grad), ("dv", dv, v.grad)):
        assert torch.isfinite(got).all(), name
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12), \
            (name, float((got - want).abs().max()))
    # fully masked rows: dQ exactly 0, and they add nothing to dK/dV (checked by autograd)
    dead = ~vis.any(dim=-1)
    if case.mask in (M.CAUSAL_BR, M.KEY_PADDING, M.RANDOM):
        assert bool(dead.any()), "the case should hold fully masked rows"
    assert bool((dq[dead] == 0).all())


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[4]], ids=lambda c: c.id)
def test_the_oracle_matches_finite_differences(case):
    """d<out, dO>/dx along random directions, by central differences in float64."""
    inp, do, vis = _inputs64(case)
    q, k, v = inp.q.double(), inp.k.double(), inp.v.double()
    dq, dk, dv = grad_reference_for_case(case, inp, do)
    gen = torch.Generator().manual_seed(7)
    eps = 1e-6

    def f(q_, k_, v_) -> float:
        return float((_forward64(case, q_, k_, v_, vis) * do.double()).sum())

    for which, grad in ((0, dq), (1, dk), (2, dv)):
        for _ in range(3):
            args = [q, k, v]
            u = torch.randn(args[which].shape, generator=gen, dtype=torch.float64)
            plus, minus = list(args), list(args)
            plus[which] = args[which] + eps * u
            minus[which] = args[which] - eps * u
            fd = (f(*plus) - f(*minus)) / (2 * eps)
            exact = float((grad * u).sum())
            assert abs(fd - exact) <= 1e-6 * max(1.0, abs(exact)), (which, fd, exact)


def test_blocks_and_devices_do_not_change_the_answer():
    case = Case(2, 4, 2, 37, 29, 16, "float16", M.CAUSAL_BR)
    inp, do, _ = _inputs64(case)
    whole = attention_grad_ref(inp.q, inp.k, inp.v, do, **case_flags(case, inp))
    blocked = attention_grad_ref(inp.q, inp.k, inp.v, do, block_rows=5,
                                 **case_flags(case, inp))
    for a, b in zip(whole, blocked, strict=True):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_naive_backward_is_close_and_in_the_input_dtype(case):
    inp, do, _ = _inputs64(case)
    ref = grad_reference_for_case(case, inp, do)
    base = grad_naive_for_case(case, inp, do)
    for name, r, b in zip(("dq", "dk", "dv"), ref, base, strict=True):
        assert b.dtype == case.torch_dtype and torch.isfinite(b).all(), name
        err = float((b.double() - r).abs().max())
        scale = float(r.abs().max()) or 1.0
        # a same-precision backward: a few % of the gradient's magnitude, and never 0
        # (the yardstick must measure rounding, not be exact by accident)
        assert 0 < err < 0.1 * scale, (name, err, scale)


def test_the_naive_backward_zeroes_fully_masked_rows_too():
    case = CASES[1]
    inp, do, vis = _inputs64(case)
    dq, _, _ = attention_grad_naive(inp.q, inp.k, inp.v, do, **case_flags(case, inp))
    dead = ~vis.any(dim=-1)
    assert bool(dead.any()) and bool((dq[dead] == 0).all())


def test_bad_shapes_are_refused():
    case = CASES[0]
    inp, do, _ = _inputs64(case)
    with pytest.raises(ValueError, match="dout"):
        attention_grad_ref(inp.q, inp.k, inp.v, do[:, :, :3])
    with pytest.raises(ValueError, match="causal_align"):
        attention_grad_ref(inp.q, inp.k, inp.v, do, causal=True, causal_align="middle")


def test_the_output_gradient_is_seeded_by_case_and_secret():
    case = CASES[0]
    a, b = make_grad_output(case), make_grad_output(case)
    assert torch.equal(a, b) and a.dtype == case.torch_dtype
    assert not torch.equal(a, make_grad_output(case, secret=5))
    assert not torch.equal(a.float(), make_inputs(case).q.float())  # not one of the inputs
