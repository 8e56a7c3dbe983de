"""Input distributions (harness.core.distributions): the case axis, what each draws, the
naive yardstick on large-magnitude inputs, and every model passing them."""

from __future__ import annotations

import pytest
import torch

from harness.candidates.models import FA2Model, all_models
from harness.core.cases import Case, Dist, Layout, MaskKind, make_inputs
from harness.core.check import check_case
from harness.core.check_grad import check_backward_case
from harness.core.distributions import FP16_MAX, PEAK_TARGET, peaky_rows
from harness.core.reference import attention_naive, naive_for_case
from harness.core.results import Status
from harness.core.seeds import derive_seed

M = MaskKind
LARGE = Case(2, 4, 2, 113, 203, 64, "float16", M.NONE, dist=Dist.LARGE)
OUTLIERS = Case(2, 8, 4, 256, 512, 64, "bfloat16", M.CAUSAL_BR, dist=Dist.OUTLIERS)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_case_axis():
    assert LARGE.id == "b2h4k2-113x203-d64-fp16-none-large"
    assert OUTLIERS.id.endswith("-causal_br-outliers")
    for case in (LARGE, OUTLIERS, Case(1, 4, 4, 64, 64, 64, sinks=True, dist="large", seed=2)):
        assert Case.from_id(case.id) == case and Case.from_dict(case.to_dict()) == case
    plain = Case(2, 4, 2, 113, 203, 64)
    assert plain.dist is Dist.NORMAL and "dist" not in plain.to_dict()
    assert "dist" not in LARGE.columns()
    with pytest.raises(ValueError, match="dist 'uniform' is not one of"):
        Case(1, 4, 4, 64, 64, 64, dist="uniform")
    with pytest.raises(ValueError, match="dense layout only"):
        Case(2, 4, 4, 64, 64, 64, layout=Layout.VARLEN, dist="outliers")


def test_a_normal_case_is_drawn_as_before_the_axis():
    case = Case(2, 4, 2, 113, 203, 64, "bfloat16", M.CAUSAL_TL)
    gen = torch.Generator().manual_seed(derive_seed(case))
    want = [torch.randn(shape, generator=gen).to(torch.bfloat16)
            for shape in ((2, 4, 113, 64), (2, 2, 203, 64), (2, 2, 203, 64))]
    got = make_inputs(case)
    assert all(torch.equal(g, w) for g, w in zip((got.q, got.k, got.v), want, strict=True))


def test_outliers_are_one_in_a_thousand_with_std_10():
    inputs = make_inputs(OUTLIERS)
    x = torch.cat([t.float().flatten() for t in (inputs.q, inputs.k, inputs.v)])
    # |N(0, 1)| > 6 is ~2e-9; an outlier (std ~10) lands there about half the time.
    frac = float((x.abs() > 6).float().mean())
    assert 2e-4 < frac < 1e-3, frac
    assert float(x.abs().max()) > 20
    again = make_inputs(OUTLIERS)
    assert torch.equal(inputs.q, again.q)
    assert not torch.equal(inputs.q, make_inputs(OUTLIERS, secret=7).q)


def test_large_inputs_have_peaky_rows_past_the_fp16_range():
    inputs = make_inputs(LARGE)
    assert all(bool(torch.isfinite(t).all()) for t in (inputs.q, inputs.k, inputs.v))
    k = inputs.k.float().repeat_interleave(2, dim=1)
    peak = (inputs.q.float() @ k.transpose(-1, -2)).abs().amax(dim=-1)  # (B, H, Nq)
    rows = peaky_rows(LARGE.seqlen_q)
    assert bool((peak[:, :, rows] > 1.5 * FP16_MAX).all())
    assert bool((peak[:, :, rows] < 1.1 * PEAK_TARGET).all())
    calm = torch.ones(LARGE.seqlen_q, dtype=torch.bool)
    calm[rows] = False
    assert bool((peak[:, :, calm] < 1000).all())


def test_the_naive_yardstick_keeps_s_in_float32_on_large_inputs():
    inputs = make_inputs(LARGE)
    out, lse = naive_for_case(LARGE, inputs)
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())
    rounded, _ = attention_naive(inputs.q, inputs.k, inputs.v)  # S rounded to fp16
    assert not bool(torch.isfinite(rounded).all())


@pytest.mark.parametrize("case", [
    LARGE, Case(2, 4, 2, 203, 113, 64, "bfloat16", M.CAUSAL_BR, dist=Dist.LARGE),
    Case(2, 4, 4, 70, 150, 128, "float16", M.RANDOM, dist=Dist.OUTLIERS),
], ids=lambda c: c.id)
def test_every_model_passes(case: Case):
    for model in all_models():
        result = check_case(model, case, device="cpu")
        assert result.status is Status.PASSED, (model.name, result.message)


def test_the_backward_on_large_inputs_is_skipped_with_the_reason():
    res = check_backward_case(FA2Model(), LARGE, device="cpu")
    assert res.status is Status.SKIPPED and "large-magnitude" in res.message
    outliers = Case(1, 4, 4, 64, 64, 64, dist=Dist.OUTLIERS)
    assert check_backward_case(FA2Model(), outliers, device="cpu").status is Status.PASSED
