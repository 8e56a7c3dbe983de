"""The peers' score modifiers on the CPU (docs/score-mods.md, "Peers"): flex_attention's
softcap and ALiBi score_mod and its sinks folded in from the LSE, and SDPA's ALiBi as a
float attn_mask, pass the check against the float64 oracle; what a peer cannot run is
skipped with its reason; and the check is not blind to them: a local copy with the ALiBi
sign flipped, the cap left out or the sink dropped fails."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.candidates import peers as peers_mod
from harness.candidates.flex import flex_candidates, flex_prepare
from harness.candidates.flex_mods import with_sinks
from harness.candidates.peers import SdpaPeer, sdpa_peers
from harness.candidates.python_candidate import PythonCandidate, to_candidate
from harness.core.cases import Case, Fp8, MaskKind
from harness.core.check import check_case
from harness.core.results import Status

F16, BF16 = "float16", "bfloat16"
M = MaskKind

SOFTCAP = Case(2, 4, 2, 113, 203, 64, F16, M.NONE, softcap=5.0)
SOFTCAP_MASKED = Case(2, 4, 2, 70, 41, 64, BF16, M.CAUSAL_BR, softcap=10.0)  # empty rows
ALIBI = Case(2, 4, 2, 113, 203, 64, F16, M.NONE, alibi=True)
ALIBI_WIDE = Case(2, 4, 2, 61, 130, 64, BF16, M.CAUSAL_BR, alibi=True)  # offset Nk - Nq
ALIBI_TL = Case(2, 4, 1, 61, 130, 64, F16, M.CAUSAL_TL, alibi=True)  # offset 0, MQA
ALIBI_PAD = Case(3, 4, 2, 47, 90, 64, F16, M.KEY_PADDING, alibi=True)  # an empty batch
ALIBI_WINDOW = Case(2, 4, 2, 61, 130, 64, F16, M.CAUSAL_BR, window_left=20, alibi=True)
SINKS = Case(2, 4, 2, 113, 203, 64, F16, M.CAUSAL_TL, sinks=True)
ALL = Case(2, 4, 2, 70, 41, 64, BF16, M.CAUSAL_BR, softcap=20.0, alibi=True, sinks=True)
SPLIT = Case(2, 4, 2, 61, 90, 192, F16, M.CAUSAL_BR, head_dim_v=128)  # d_qk > d_v
D96 = Case(1, 4, 2, 61, 90, 96, BF16, M.RANDOM)


def flex(prepare=flex_prepare, name: str = "flex_attention") -> PythonCandidate:
    """The shipped flex_attention declaration on the CPU (eager), with `prepare` swapped
    for a local copy where a test asks."""
    k = flex_candidates()[0]
    return to_candidate(dataclasses.replace(k, name=name, device="cpu", prepare=prepare),
                        "test")


def sdpa_math() -> SdpaPeer:
    p = {x.name: x for x in sdpa_peers()}["sdpa_math"]
    return SdpaPeer(name="sdpa_math", kind="peer", device="cpu", backend="math",
                    support=p.support)


@pytest.mark.parametrize("case", [SOFTCAP, SOFTCAP_MASKED, ALIBI, ALIBI_WIDE, ALIBI_TL,
                                  ALIBI_PAD, ALIBI_WINDOW, SINKS, ALL, SPLIT, D96],
                         ids=lambda c: c.id)
def test_flex_matches_the_oracle(case):
    res = check_case(flex(), case, device="cpu")
    assert res.status is Status.PASSED, res.message


@pytest.mark.parametrize("case", [ALIBI, ALIBI_WIDE, ALIBI_TL, ALIBI_PAD, ALIBI_WINDOW,
                                  SPLIT, D96], ids=lambda c: c.id)
def test_sdpa_math_matches_the_oracle(case):
    res = check_case(sdpa_math(), case, device="cpu")
    assert res.status is Status.PASSED, res.message


@pytest.mark.parametrize("case,why", [(SOFTCAP, "SDPA cannot softcap"),
                                      (SINKS, "SDPA cannot add a sink"),
                                      (ALL, "SDPA cannot softcap")], ids=["softcap", "sinks",
                                                                          "all"])
def test_sdpa_skips_softcap_and_sinks_with_the_reason(case, why):
    for peer in (sdpa_math(), *sdpa_peers()):
        res = check_case(peer, case, device="cpu")
        assert res.status is Status.SKIPPED and why in res.message, (peer.name, res.message)
        assert res.message.startswith(peer.name)


def test_fp8_is_skipped_by_both_with_a_reason():
    case = Case(2, 4, 2, 61, 90, 64, BF16, M.CAUSAL_BR, fp8=Fp8.QKV_HEAD)
    res = check_case(flex(), case, device="cpu")
    assert res.status is Status.SKIPPED and "no descale arguments" in res.message
    res = check_case(sdpa_math(), case, device="cpu")
    assert res.status is Status.SKIPPED and "fp8" in res.message


def _flipped_alibi(q, k, v, *, alibi_slopes=None, **kw):  # noqa: ANN001, ANN202
    # a local copy of the peer whose ALiBi adds the distance instead of subtracting it
    return flex_prepare(q, k, v, alibi_slopes=-alibi_slopes, **kw)


def _no_cap(q, k, v, *, softcap=0.0, **kw):  # noqa: ANN001, ANN202
    return flex_prepare(q, k, v, softcap=0.0, **kw)


def _sink_dropped(q, k, v, *, sinks=None, **kw):  # noqa: ANN001, ANN202
    return flex_prepare(q, k, v, sinks=None, **kw)


@pytest.mark.parametrize("prepare,case,reason", [
    (_flipped_alibi, ALIBI, "out: max error"),
    (_flipped_alibi, ALIBI_WIDE, "out: max error"),
    (_no_cap, SOFTCAP, "out: max error"),
    (_sink_dropped, SINKS, "lse: max error"),
], ids=["alibi-sign", "alibi-sign-causal", "softcap-missing", "sink-dropped"])
def test_a_wrong_flex_modifier_is_caught(prepare, case, reason):
    res = check_case(flex(prepare, "flex_wrong"), case, device="cpu")
    assert res.status is Status.FAILED and reason in res.message, res.message


def test_a_wrong_sdpa_alibi_sign_is_caught(monkeypatch):
    right = peers_mod.alibi_mask

    def flipped(case, inputs):  # noqa: ANN001, ANN202
        return right(case, dataclasses.replace(inputs, alibi_slopes=-inputs.alibi_slopes))

    monkeypatch.setattr(peers_mod, "alibi_mask", flipped)
    for case in (ALIBI, ALIBI_WIDE):
        res = check_case(sdpa_math(), case, device="cpu")
        assert res.status is Status.FAILED and "out: max error" in res.message, res.message


def test_a_sink_holds_a_row_with_no_key():
    out = torch.ones(1, 2, 3, 4, dtype=torch.float16)
    lse = torch.tensor([[[0.0, -torch.inf, 1.0], [2.0, -torch.inf, 0.5]]])
    z = torch.tensor([0.0, 3.0])
    got, got_lse = with_sinks(out, lse, z)
    assert torch.equal(got[:, :, 1], torch.zeros(1, 2, 4, dtype=torch.float16))
    assert torch.equal(got_lse[:, :, 1], z[None])
    assert got[0, 0, 0, 0].item() == pytest.approx(0.5, rel=1e-3)  # e^0 / (e^0 + e^0)
    assert torch.allclose(got_lse[0, 0], torch.tensor([0.6931472, 0.0, 1.3132617]))
    same = with_sinks(out, lse, None)
    assert same[0] is out and same[1] is lse


def test_an_alibi_mask_in_fp16_fails_where_every_key_is_far(monkeypatch):
    """Why the SDPA peer's ALiBi mask is float32 (docs/score-mods.md, "Peers"): rounded to
    fp16, the bias of keys far from the diagonal is off by up to half a step of 2^-5, and
    on this key-padding case (rows whose visible keys are all far away) the output fails
    the check; the float32 mask passes it."""
    case = Case(3, 4, 2, 97, 130, 64, F16, M.KEY_PADDING, alibi=True)
    assert check_case(sdpa_math(), case, device="cpu").status is Status.PASSED
    right = peers_mod.alibi_mask
    monkeypatch.setattr(peers_mod, "alibi_mask",
                        lambda c, inputs: right(c, inputs).to(inputs.q.dtype))
    res = check_case(sdpa_math(), case, device="cpu")
    assert res.status is Status.FAILED and "out: max error" in res.message, res.message
