"""The SDPA peers on the CPU: sdpa_math goes through the real check on every mask kind,
refusals are decided by trying and cached, the GPU backends skip cleanly here."""

from __future__ import annotations

import pytest
import torch

from harness.candidates.peers import BackendRefused, SdpaPeer, sdpa_peers
from harness.core.cases import Case, MaskKind, make_inputs
from harness.core.check import check_case
from harness.core.results import Status

CASES = [
    Case(2, 4, 4, 33, 17, 32, "float16", MaskKind.CAUSAL_BR, 1),  # Nq > Nk: masked rows
    Case(2, 4, 2, 17, 33, 24, "bfloat16", MaskKind.CAUSAL_BR, 2),  # GQA
    Case(1, 2, 2, 20, 31, 16, "float16", MaskKind.CAUSAL_TL, 3),
    Case(3, 4, 1, 9, 40, 64, "float16", MaskKind.KEY_PADDING, 4),  # MQA, an empty batch
    Case(2, 2, 2, 22, 22, 40, "bfloat16", MaskKind.RANDOM, 5),  # every 7th row masked
    Case(1, 2, 2, 1, 50, 32, "float16", MaskKind.NONE, 6),  # decode-like
]


def peers():
    return {p.name: p for p in sdpa_peers()}


def test_four_backends_named_and_placed():
    ps = peers()
    assert set(ps) == {"sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math"}
    assert all(p.kind == "peer" and not p.support.writes_lse for p in ps.values())
    if not torch.cuda.is_available():
        assert ps["sdpa_math"].device == "cpu"
        assert "CUDA" in ps["sdpa_flash"].supports(CASES[0])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_sdpa_math_passes_the_check_on_cpu(case):
    math_peer = SdpaPeer(name="sdpa_math", kind="peer", device="cpu", backend="math",
                         support=peers()["sdpa_math"].support)
    res = check_case(math_peer, case, device="cpu")
    assert res.status is Status.PASSED, res.message
    assert res.errors.ratio is not None and res.errors.ratio <= 2


def test_refusal_is_decided_by_trying_and_cached(monkeypatch):
    # cuDNN has no CPU kernel: forced onto the CPU, torch refuses and says so.
    cudnn_cpu = SdpaPeer(name="sdpa_cudnn", kind="peer", device="cpu", backend="cudnn")
    calls = []
    real_try = SdpaPeer._try

    def counting(self, case, inputs, gqa_native):
        calls.append(gqa_native)
        return real_try(self, case, inputs, gqa_native)

    monkeypatch.setattr(SdpaPeer, "_try", counting)
    case = Case(2, 4, 2, 16, 16, 32)
    reason = cudnn_cpu.supports(case)
    assert reason and reason.startswith("sdpa_cudnn:")
    assert calls == [True, False]  # enable_gqa refused, repeated K/V tried too
    assert cudnn_cpu.supports(Case(7, 4, 2, 16, 16, 32, seed=9)) == reason  # batch/seed: cached
    assert calls == [True, False]
    res = check_case(cudnn_cpu, case, device="cpu")
    assert res.status is Status.SKIPPED and "sdpa_cudnn" in res.message
    with pytest.raises(BackendRefused):
        cudnn_cpu.timed_call(case, make_inputs(case), None, None)


def test_timed_call_leaves_out_alone_and_run_fills_it():
    p = SdpaPeer(name="sdpa_math", kind="peer", device="cpu", backend="math")
    case = CASES[1]
    inputs = make_inputs(case)
    out = torch.full((case.batch, case.heads, case.seqlen_q, case.head_dim), 7.0,
                     dtype=case.torch_dtype)
    result = p.timed_call(case, inputs, out, None)()
    assert torch.all(out == 7.0)
    p.run(case, inputs, out, None)
    assert torch.equal(out, result)


def test_math_refuses_a_huge_score_matrix():
    p = SdpaPeer(name="sdpa_math", kind="peer", device="cpu", backend="math")
    assert "score matrix" in p.supports(Case(64, 32, 32, 8192, 8192, 64))
