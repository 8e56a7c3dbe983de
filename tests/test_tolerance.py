"""The one tolerance rule: what passes, what fails, and what the messages say."""

from __future__ import annotations

import math

import pytest
import torch

from harness.core.cases import Case, MaskKind, make_inputs
from harness.core.reference import naive_for_case, reference_for_case
from harness.core.tolerance import Baseline, check_output, data_floor

# Nq > Nk, bottom-right causal: the first 16 rows are fully masked.
CASE = Case(2, 4, 2, 48, 32, 64, "float16", MaskKind.CAUSAL_BR)


@pytest.fixture(scope="module")
def setup():
    inp = make_inputs(CASE)
    ref = reference_for_case(CASE, inp)
    base = naive_for_case(CASE, inp)
    good = ref[0].to(torch.float16), ref[1].float()  # the oracle rounded: the best possible
    return ref, base, good


def check(out, lse, setup, **kw):
    ref, base, _ = setup
    kw.setdefault("writes_lse", True)
    return check_output(CASE, out, lse, ref, base, **kw)


def test_rounded_oracle_and_naive_pass(setup):
    ref, base, good = setup
    v = check(*good, setup)
    assert v.passed, v.message
    assert v.errors.ratio is not None and v.errors.ratio <= 1.0
    v = check(base[0], base[1], setup)
    assert v.passed, v.message
    assert v.errors.ratio == pytest.approx(1.0)


def test_perturbed_output_fails_with_index_and_both_errors(setup):
    out, lse = (t.clone() for t in setup[2])
    out[1, 2, 30, 5] += 0.1
    v = check(out, lse, setup)
    assert not v.passed
    assert "out: max error" in v.message and "(b=1, h=2, i=30, j=5)" in v.message
    assert "naive error" in v.message and v.errors.ratio > 2
    assert v.errors.worst_index == [1, 2, 30, 5]
    assert v.errors.out_err > 2 * v.errors.base_err + v.errors.floor


def test_error_just_inside_and_outside_the_bound(setup):
    ref, base, good = setup
    bl = Baseline.compute(ref, base, torch.float16)
    bound = 2 * bl.out_err + bl.floor
    for extra, ok in ((0.5 * bound, True), (2.5 * bound, False)):
        out = good[0].clone()
        out[0, 0, 40, 0] = (ref[0][0, 0, 40, 0] + extra).half()
        assert check(out, good[1], setup).passed is ok


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_never_passes(setup, value):
    out, lse = (t.clone() for t in setup[2])
    out[0, 1, 20, 3] = value
    v = check(out, lse, setup)
    assert not v.passed and "non-finite" in v.message and "(b=0, h=1, i=20, j=3)" in v.message


def test_fully_masked_row_must_be_exactly_zero(setup):
    out, lse = (t.clone() for t in setup[2])
    out[1, 0, 3, 7] = 1e-4  # row 3 sees no key; tiny, well under any tolerance
    v = check(out, lse, setup)
    assert not v.passed and "fully masked row not exactly 0" in v.message


def test_lse_checked_when_written(setup):
    out, lse = (t.clone() for t in setup[2])
    bad = lse.clone()
    bad[0, 0, 40] += 0.05
    v = check(out, bad, setup)
    assert not v.passed and "lse: max error" in v.message and "(b=0, h=0, i=40)" in v.message
    assert check(out, bad, setup, writes_lse=False).passed  # not judged when not written
    nan = lse.clone()
    nan[1, 1, 20] = math.nan
    assert "non-finite" in check(out, nan, setup).message


def test_masked_lse_conventions(setup):
    out, lse = (t.clone() for t in setup[2])
    plus = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
    assert check(out, lse, setup).passed
    v = check(out, plus, setup)
    assert not v.passed and "must be -inf" in v.message
    assert check(out, plus, setup, masked_lse="+inf").passed
    assert not check(out, lse, setup, masked_lse="+inf").passed
    zero = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    assert not check(out, zero, setup).passed


def test_data_floor_is_rounding_sized():
    ref = torch.linspace(-3, 3, 1000, dtype=torch.float64)
    f16, bf16 = data_floor(ref, torch.float16), data_floor(ref, torch.bfloat16)
    assert 0 < f16 < 1e-2 and f16 < bf16 < 5e-2


def test_shape_mismatch_is_a_failure(setup):
    v = check(setup[2][0][:, :, :-1], setup[2][1], setup)
    assert not v.passed and "shape" in v.message
