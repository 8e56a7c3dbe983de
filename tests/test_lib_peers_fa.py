"""FlashAttention 3 and 4 as peers (harness.candidates.lib_peers_fa) on the CPU: registered
only where the library imports, and their argument mapping judged by the harness's own
checks against stand-ins computing what each library's interface says its flash_attn_func
computes: (B, N, H, d) tensors; causal and windows bottom-right aligned; softcap on the
scaled score; FA3's e4m3 inputs with (B, Hkv) descales, O in bf16 and LSE +inf for a row
that sees no key; FA4's learnable sink in the denominator, LSE -inf for an empty row."""

from __future__ import annotations

import sys

import pytest
import torch
from lib_standins import attend, stand_in

from harness.candidates import lib_peers_fa
from harness.candidates.python_candidate import to_candidate
from harness.core.cases import Case, MaskKind
from harness.core.check import check_case
from harness.core.check_grad import check_backward_case
from harness.core.results import Status

M = MaskKind


def _fa3_func(q, k, v, softmax_scale=None, causal=False, qv=None,  # noqa: ANN001
              q_descale=None, k_descale=None, v_descale=None, window_size=(-1, -1),
              attention_chunk=0, softcap=0.0, num_splits=1, pack_gqa=None,
              deterministic=False, sm_margin=0, return_attn_probs=False):
    """flash_attn_interface.flash_attn_func (FlashAttention 3) as its docstring states it."""
    assert qv is None and attention_chunk == 0 and num_splits == 1
    b, hk = q.shape[0], k.shape[2]
    fp8 = q.dtype == torch.float8_e4m3fn
    if fp8:
        for t in (q_descale, k_descale, v_descale):
            assert t.shape == (b, hk) and t.dtype == torch.float32
        q = q.float() * q_descale.repeat_interleave(q.shape[2] // hk, dim=1)[:, None, :, None]
        k = k.float() * k_descale[:, None, :, None]
        v = v.float() * v_descale[:, None, :, None]
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out, lse = attend(q, k, v, scale, causal, *window_size, softcap, empty_lse=float("inf"))
    out = out.to(torch.bfloat16 if fp8 else q.dtype)
    return (out, lse) if return_attn_probs else out


def _fa4_func(q, k, v, softmax_scale=None, causal=False,  # noqa: ANN001
              window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1,
              pack_gqa=None, deterministic=False, return_lse=False):
    """flash_attn.cute.flash_attn_func (FlashAttention 4) as its interface states it."""
    assert learnable_sink is None or learnable_sink.shape == (q.shape[2],)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out, lse = attend(q, k, v, scale, causal, *window_size, softcap, sink=learnable_sink)
    return out.to(q.dtype), (lse if return_lse or q.requires_grad else None)


@pytest.fixture
def fa3(monkeypatch):
    stand_in(monkeypatch, "flash_attn_interface", flash_attn_func=_fa3_func)
    (peer,) = lib_peers_fa.flash_attn3_candidates(device="cpu")
    return to_candidate(peer, "test")


def _fa4(monkeypatch, fn):  # noqa: ANN001
    stand_in(monkeypatch, "flash_attn", __path__=[])
    stand_in(monkeypatch, "flash_attn.cute", flash_attn_func=fn)
    (peer,) = lib_peers_fa.flash_attn4_candidates(device="cpu")
    return to_candidate(peer, "test")


@pytest.fixture
def fa4(monkeypatch):
    return _fa4(monkeypatch, _fa4_func)


@pytest.fixture
def fa4_old(monkeypatch):
    """A version without return_lse: the LSE comes only for an input requiring grad."""
    def fn(q, k, v, softmax_scale=None, causal=False, window_size=(None, None),  # noqa: ANN001
           learnable_sink=None, softcap=0.0):
        return _fa4_func(q, k, v, softmax_scale, causal, window_size, learnable_sink, softcap)
    return _fa4(monkeypatch, fn)


@pytest.mark.parametrize("module, factory", [
    ("flash_attn_interface", lib_peers_fa.flash_attn3_candidates),
    ("flash_attn.cute", lib_peers_fa.flash_attn4_candidates),
])
def test_no_library_no_candidate(monkeypatch, module, factory):
    monkeypatch.delitem(sys.modules, module, raising=False)
    if lib_peers_fa._importable(module):
        pytest.skip(f"{module} is installed here")
    assert factory() == []


def _id(v: object) -> str:
    return v.id if isinstance(v, Case) else str(v)


FA3_CASES = [
    Case(2, 4, 4, 113, 203, 64, "float16", M.NONE),
    Case(2, 4, 2, 203, 113, 128, "bfloat16", M.CAUSAL_BR),   # empty rows: LSE +inf
    Case(2, 6, 2, 113, 203, 128, "float16", M.CAUSAL_BR, softcap=10.0),
    Case(2, 4, 4, 113, 203, 64, "float16", M.NONE, window_left=32, window_right=8),
    Case(2, 4, 2, 113, 203, 192, "bfloat16", M.NONE, head_dim_v=128),
    Case(1, 4, 1, 64, 150, 256, "float16", M.CAUSAL_BR),
    Case(2, 4, 4, 113, 203, 128, "bfloat16", M.CAUSAL_BR, fp8="qkv_head"),
    Case(2, 4, 2, 70, 150, 128, "bfloat16", M.NONE, fp8="qkv_tensor"),
]

FA3_LACKS = [
    (Case(2, 4, 1, 113, 203, 64, "bfloat16", M.CAUSAL_TL), "causal_tl mask"),
    (Case(3, 4, 2, 97, 130, 64, "float16", M.KEY_PADDING), "key_padding mask"),
    (Case(2, 4, 4, 113, 203, 64, "float16", M.NONE, alibi=True), "alibi"),
    (Case(2, 4, 4, 113, 203, 64, "float16", M.NONE, sinks=True), "sink"),
    (Case(2, 4, 4, 113, 203, 128, "float16", M.NONE, fp8="qkv_tensor"), "bf16 only"),
    (Case(2, 4, 2, 113, 203, 128, "bfloat16", M.NONE, fp8="qkv_head"), "per KV head"),
    (Case(1, 8, 2, 1, 239, 128, "bfloat16", M.NONE, fp8="kv_head"), "e4m3 cache"),
]


def test_the_fa3_backward_through_autograd_passes(fa3):
    res = check_backward_case(fa3, Case(2, 4, 2, 113, 203, 64, "float16", M.CAUSAL_BR),
                              device="cpu")
    assert res.status is Status.PASSED, res.message


FA4_CASES = [
    Case(2, 4, 4, 113, 203, 64, "float16", M.NONE),
    Case(2, 4, 2, 203, 113, 128, "bfloat16", M.CAUSAL_BR),   # empty rows: LSE -inf
    Case(2, 6, 2, 113, 203, 128, "float16", M.CAUSAL_BR, softcap=10.0),
    Case(2, 4, 2, 203, 113, 64, "bfloat16", M.CAUSAL_BR, sinks=True),  # empty rows: the sink
    Case(2, 4, 4, 113, 203, 96, "float16", M.NONE, window_left=32, window_right=8,
         sinks=True),
    Case(2, 4, 2, 113, 203, 192, "bfloat16", M.NONE, head_dim_v=128),
]

FA4_LACKS = [
    (Case(2, 4, 1, 113, 203, 64, "bfloat16", M.CAUSAL_TL), "causal_tl mask"),
    (Case(2, 4, 4, 113, 203, 64, "float16", M.NONE, alibi=True), "alibi"),
    (Case(1, 4, 1, 64, 150, 256, "float16", M.NONE), "head dims 256/256"),
    (Case(2, 4, 4, 113, 203, 128, "bfloat16", M.NONE, fp8="qkv_tensor"), "FP8"),
]


@pytest.mark.parametrize("peer, case", [("fa3", c) for c in FA3_CASES]
                         + [(p, c) for c in FA4_CASES for p in ("fa4", "fa4_old")], ids=_id)
def test_the_peer_passes_the_harness_checks(request, peer: str, case: Case):
    cand = request.getfixturevalue(peer)
    assert cand.supports(case) is None
    res = check_case(cand, case, device="cpu")
    assert res.status is Status.PASSED, res.message


@pytest.mark.parametrize("peer, case, why", [("fa3", *c) for c in FA3_LACKS]
                         + [("fa4", *c) for c in FA4_LACKS], ids=_id)
def test_what_the_library_lacks_is_skipped_with_the_reason(request, peer: str, case: Case,
                                                          why: str):
    res = check_case(request.getfixturevalue(peer), case, device="cpu")
    assert res.status is Status.SKIPPED and why.lower() in res.message.lower(), res.message


def test_a_wrong_offset_is_refused_not_computed():
    q = torch.zeros(1, 2, 3, 64, dtype=torch.float16)
    for fwd in (lib_peers_fa.flash_attn3_forward, lib_peers_fa.flash_attn4_forward):
        with pytest.raises(ValueError, match="offset"):
            fwd(q, q, q, mask_kind="causal_br", mask=None, key_lengths=None,
                causal_offset=5, scale=0.125)
