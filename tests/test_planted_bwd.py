"""The backward check (harness.core.check_grad) on the CPU: the FA2 backward model passes
every smoke case and moves the bytes the backward IO model says; each planted backward
bug fails on the cases that expose it; the buffer and input checks catch a backward that
writes too little, too far or into its inputs; FLOPs are 2.5x the forward's."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from harness.candidates.models import FA2Model
from harness.candidates.models.planted_bwd import (
    CausalNotRecomputed,
    DroppedDelta,
    GroupNotSummed,
    LostDQUpdate,
    MissingScaleInDS,
    NaNOnMaskedRows,
    planted_backward_bugs,
)
from harness.core.cases import Case, MaskKind
from harness.core.check_grad import check_backward_case, grad_inputs
from harness.core.flops import attention_bwd_flops, attention_flops
from harness.core.grids import get_grid
from harness.core.iomodel_bwd import hbm_breakdown_bwd, hbm_bytes_bwd
from harness.core.results import Status

M = MaskKind
SMOKE = get_grid("smoke")
# The CPU models run many small tile ops: one torch thread each (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("case", SMOKE, ids=lambda c: c.id)
def test_the_fa2_backward_model_passes_every_smoke_case(case):
    res = check_backward_case(FA2Model(), case, device="cpu", repeats=2)
    assert res.status is Status.PASSED, res.message
    assert res.extra["pass"] == "bwd" and res.extra["determinism"] == "2 runs bitwise equal"
    detail = res.extra["grad_errors"]
    assert detail["factor"] == 3.0 and set(detail) == {"factor", "dq", "dk", "dv"}
    assert 0 <= res.errors.ratio <= 3.0
    assert res.flops == attention_bwd_flops(case) and res.bytes_model > 0


# Each bug with a case that must expose it (and the grid's verdict on all of them).
EXPOSED_BY = {
    DroppedDelta: Case(2, 4, 4, 113, 203, 64, "float16", M.NONE),
    MissingScaleInDS: Case(2, 4, 4, 113, 203, 64, "float16", M.NONE),
    GroupNotSummed: Case(2, 8, 2, 128, 128, 128, "float16", M.NONE),
    CausalNotRecomputed: Case(2, 4, 4, 113, 203, 64, "bfloat16", M.CAUSAL_TL),
    NaNOnMaskedRows: Case(2, 4, 4, 203, 113, 64, "float16", M.CAUSAL_BR),
    LostDQUpdate: Case(2, 4, 4, 113, 203, 64, "float16", M.NONE),
}


@pytest.mark.parametrize("bug", list(EXPOSED_BY), ids=lambda b: b.__name__)
def test_each_planted_backward_bug_is_caught(bug):
    res = check_backward_case(bug(), EXPOSED_BY[bug], device="cpu")
    assert res.status is Status.FAILED, res.message
    if bug is NaNOnMaskedRows:
        assert "non-finite" in res.message
    elif bug is LostDQUpdate:
        assert res.message.startswith("dq: max error")  # dK and dV are still right
    elif bug is GroupNotSummed:
        assert "dk: max error" in res.message and "dv: max error" in res.message
        assert "dq:" not in res.message
    else:
        assert "exceeds 3 x naive error" in res.message


def test_every_planted_backward_bug_fails_somewhere_on_the_smoke_grid():
    for bug in planted_backward_bugs():
        # The grid's verdict fails at its first failing case: no need to check the rest.
        assert any(check_backward_case(bug, c, device="cpu").status is Status.FAILED
                   for c in SMOKE), bug.name
        assert bug.support.backward


@pytest.mark.parametrize("case", [
    Case(2, 4, 4, 113, 203, 64, "float16", M.NONE),
    Case(2, 4, 2, 203, 113, 64, "float16", M.CAUSAL_BR),
    Case(1, 4, 1, 64, 97, 128, "bfloat16", M.CAUSAL_TL),
    Case(2, 6, 2, 97, 64, 64, "float16", M.KEY_PADDING),
], ids=lambda c: c.id)
def test_the_models_bytes_are_the_backward_io_model(case):
    m = FA2Model()
    res = check_backward_case(m, case, device="cpu")
    assert res.status is Status.PASSED, res.message
    counted = m.last_bytes_bwd
    terms = hbm_breakdown_bwd("fa2_bwd", case, m.tiles)
    assert counted.total == hbm_bytes_bwd("fa2_bwd", case, m.tiles) == sum(terms.values())
    assert res.bytes_model == counted.total


def test_the_backward_traffic_formulas():
    """The chapter's exercise: FA2's backward re-reads Q, dO and the float32 dQ
    accumulator once per K/V block, so its bytes grow as Nq * Nk / B_k (Theta(N^2 d^2 / M)
    like the forward's), while the naive backward passes seven times over the Nq x Nk
    matrices. Which is smaller depends on d and B_k."""
    d64 = Case(1, 32, 32, 4096, 4096, 64, "float16", M.NONE)
    d128 = Case(1, 16, 16, 4096, 4096, 128, "float16", M.NONE)

    def fa2(case, bk):
        return hbm_bytes_bwd("fa2_bwd", case, {"block_q": 64, "block_k": bk})

    naive64, naive128 = hbm_bytes_bwd("naive_bwd", d64), hbm_bytes_bwd("naive_bwd", d128)
    assert fa2(d64, 128) < naive64 / 2  # d = 64, B_k = 128: FA2 moves less than half
    assert fa2(d128, 64) > naive128  # d = 128, B_k = 64: the accumulator costs more
    # halving B_k doubles every per-visit term, the rest stays
    visits = {k: v for k, v in hbm_breakdown_bwd("fa2_bwd", d128, {"block_k": 128}).items()}
    halved = hbm_breakdown_bwd("fa2_bwd", d128, {"block_k": 64})
    for term in ("read Q", "read dO", "read dQ acc", "write dQ acc", "read LSE"):
        assert halved[term] == 2 * visits[term], term
    assert halved["read K"] == visits["read K"] and halved["write dK"] == visits["write dK"]
    # the naive backward grows with the score matrix, the ideal with the vectors only
    long = Case(1, 16, 16, 8192, 8192, 128, "float16", M.NONE)
    assert hbm_bytes_bwd("naive_bwd", long) > 3.9 * naive128
    assert hbm_bytes_bwd("ideal_bwd", long) == 2 * hbm_bytes_bwd("ideal_bwd", d128)


def test_backward_flops_are_two_and_a_half_times_the_forward():
    for case in SMOKE:
        assert attention_bwd_flops(case) * 2 == attention_flops(case) * 5


@dataclass
class WritesTooLittle(FA2Model):
    name: str = "bwd_skips_dv"

    def write_kv_grads(self, case, dk_heads, dv_heads, dk, dv, counter) -> None:
        dk.copy_(self.reduce_group(case, dk_heads).to(dk.dtype))  # dv never written


@dataclass
class WritesIntoDO(FA2Model):
    name: str = "bwd_scribbles_dout"

    def run_backward(self, case, inputs, dq, dk, dv) -> None:
        super().run_backward(case, inputs, dq, dk, dv)
        inputs.dout.mul_(2)


@dataclass
class Nondeterministic(FA2Model):
    name: str = "bwd_nondeterministic"
    calls: int = 0

    def run_backward(self, case, inputs, dq, dk, dv) -> None:
        super().run_backward(case, inputs, dq, dk, dv)
        self.calls += 1
        if self.calls % 2 == 0:  # every other run a last-bit difference, as atomics give
            dq.view(torch.int16)[0, 0, 0, 0] ^= 1


def test_buffers_inputs_and_determinism_are_checked():
    case = Case(1, 2, 2, 33, 47, 32, "float16", M.NONE)
    res = check_backward_case(WritesTooLittle(), case, device="cpu")
    assert res.status is Status.FAILED and "dv:" in res.message and "never written" in res.message
    res = check_backward_case(WritesIntoDO(), case, device="cpu")
    assert res.status is Status.FAILED and "input dout was modified" in res.message
    # declared deterministic: a bitwise difference between repeats fails ...
    res = check_backward_case(Nondeterministic(), case, device="cpu", repeats=3)
    assert res.status is Status.FAILED and "nondeterministic backward" in res.message
    # ... declared nondeterministic (atomics): reported, judged on the first run
    nd = Nondeterministic()
    nd.support = type(nd.support)(backward=True, backward_deterministic=False)
    res = check_backward_case(nd, case, device="cpu", repeats=3)
    assert res.status is Status.PASSED, res.message
    assert res.extra["determinism"].startswith("not bitwise deterministic")


def test_a_candidate_without_a_backward_is_skipped_with_the_reason():
    from harness.candidates.models import NaiveModel

    res = check_backward_case(NaiveModel(), SMOKE[0], device="cpu")
    assert res.status is Status.SKIPPED and res.message == "declares no backward"


def test_the_backward_gets_the_lse_in_its_own_masked_row_convention():
    case = Case(2, 4, 4, 203, 113, 64, "float16", M.CAUSAL_BR)
    m = FA2Model()
    minus = grad_inputs(case, m, "cpu").lse
    m.support = type(m.support)(masked_lse="+inf", backward=True)
    plus = grad_inputs(case, m, "cpu").lse
    masked = torch.isneginf(minus)
    assert bool(masked.any()) and bool(torch.isposinf(plus[masked]).all())
    assert torch.equal(minus[~masked], plus[~masked])
