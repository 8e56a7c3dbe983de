"""FlashAttention 3 and 4 as peers (harness.candidates.lib_peers_fa) on the CPU: registered
only where the library imports, and their argument mapping judged by the harness's own
checks against stand-ins computing what each library's interface says its flash_attn_func
computes: (B, N, H, d) tensors; causal and windows bottom-right aligned; softcap on the
scaled score; FA3's e4m3 inputs with (B, Hkv) descales, O in bf16 and LSE +inf for a row
that sees no key; FA4's learnable sink in the denominator, LSE -inf for an empty row."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest
import torch

from harness.candidates import lib_peers_fa
from harness.candidates.python_candidate import to_candidate
from harness.core.cases import Case, MaskKind
from harness.core.check import check_case
from harness.core.check_grad import check_backward_case
from harness.core.results import Status

M = MaskKind


def _attend(q, k, v, scale, causal, left, right, softcap, sink=None, empty_lse=float("-inf")):  # noqa: ANN001
    """Attention on (B, N, H, d) float tensors as the interfaces describe it, float32."""
    b, nq, h, d = q.shape
    nk, hk = k.shape[1], k.shape[2]
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(h // hk, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(h // hk, dim=1)
    s = qf @ kf.transpose(-1, -2) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    off = nk - nq
    if causal:
        right = 0
    vis = torch.ones(nq, nk, dtype=torch.bool)
    if left is not None and left >= 0:
        vis &= j >= i + off - left
    if right is not None and right >= 0:
        vis &= j <= i + off + right
    s = s.masked_fill(~vis, float("-inf"))
    if sink is not None:   # a key with no value, in the denominator only
        z = sink.float()[None, :, None, None].expand(b, h, nq, 1)
        lse = torch.logsumexp(torch.cat([s, z], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = (p @ vf).transpose(1, 2)
    if sink is None:
        lse = torch.where(torch.isneginf(lse), torch.full_like(lse, empty_lse), lse)
    return out, lse


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
    out, lse = _attend(q, k, v, scale, causal, *window_size, softcap, empty_lse=float("inf"))
    out = out.to(torch.bfloat16 if fp8 else q.dtype)
    return (out, lse) if return_attn_probs else out


def _fa4_func(q, k, v, softmax_scale=None, causal=False,  # noqa: ANN001
              window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1,
              pack_gqa=None, deterministic=False, return_lse=False):
    """flash_attn.cute.flash_attn_func (FlashAttention 4) as its interface states it."""
    assert learnable_sink is None or learnable_sink.shape == (q.shape[2],)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out, lse = _attend(q, k, v, scale, causal, *window_size, softcap, sink=learnable_sink)
    return out.to(q.dtype), (lse if return_lse or q.requires_grad else None)


def _stand_in(monkeypatch, name: str, **functions) -> None:  # noqa: ANN001
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for attr, fn in functions.items():
        setattr(mod, attr, fn)
    monkeypatch.setitem(sys.modules, name, mod)


@pytest.fixture
def fa3(monkeypatch):
    _stand_in(monkeypatch, "flash_attn_interface", flash_attn_func=_fa3_func)
    (peer,) = lib_peers_fa.flash_attn3_candidates(device="cpu")
    return to_candidate(peer, "test")


@pytest.fixture(params=["return_lse", "requires_grad"])
def fa4(monkeypatch, request):
    fn = _fa4_func
    if request.param == "requires_grad":   # a version without return_lse
        def fn(q, k, v, softmax_scale=None, causal=False, window_size=(None, None),  # noqa: ANN001
               learnable_sink=None, softcap=0.0):
            return _fa4_func(q, k, v, softmax_scale, causal, window_size, learnable_sink,
                             softcap)
    _stand_in(monkeypatch, "flash_attn", __path__=[])
    _stand_in(monkeypatch, "flash_attn.cute", flash_attn_func=fn)
    (peer,) = lib_peers_fa.flash_attn4_candidates(device="cpu")
    return to_candidate(peer, "test")


@pytest.mark.parametrize("module, factory", [
    ("flash_attn_interface", lib_peers_fa.flash_attn3_candidates),
    ("flash_attn.cute", lib_peers_fa.flash_attn4_candidates),
])
def test_no_library_no_candidate(monkeypatch, module, factory):
    monkeypatch.delitem(sys.modules, module, raising=False)
    if lib_peers_fa._importable(module):
        pytest.skip(f"{module} is installed here")
    assert factory() == []


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


@pytest.mark.parametrize("case", FA3_CASES, ids=lambda c: c.id)
def test_the_fa3_peer_passes_the_harness_checks(fa3, case: Case):
    assert fa3.supports(case) is None
    res = check_case(fa3, case, device="cpu")
    assert res.status is Status.PASSED, res.message


@pytest.mark.parametrize("case, why", [
    (Case(2, 4, 1, 113, 203, 64, "bfloat16", M.CAUSAL_TL), "causal_tl mask"),
    (Case(3, 4, 2, 97, 130, 64, "float16", M.KEY_PADDING), "key_padding mask"),
    (Case(2, 4, 4, 113, 203, 64, "float16", M.NONE, alibi=True), "alibi"),
    (Case(2, 4, 4, 113, 203, 64, "float16", M.NONE, sinks=True), "sink"),
    (Case(2, 4, 4, 113, 203, 128, "float16", M.NONE, fp8="qkv_tensor"), "bf16 only"),
    (Case(2, 4, 2, 113, 203, 128, "bfloat16", M.NONE, fp8="qkv_head"), "per KV head"),
    (Case(1, 8, 2, 1, 239, 128, "bfloat16", M.NONE, fp8="kv_head"), "e4m3 cache"),
])
def test_what_fa3_lacks_is_skipped_with_the_reason(fa3, case: Case, why: str):
    res = check_case(fa3, case, device="cpu")
    assert res.status is Status.SKIPPED and why in res.message, res.message


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


@pytest.mark.parametrize("case", FA4_CASES, ids=lambda c: c.id)
def test_the_fa4_peer_passes_the_harness_checks(fa4, case: Case):
    assert fa4.supports(case) is None
    res = check_case(fa4, case, device="cpu")
    assert res.status is Status.PASSED, res.message


@pytest.mark.parametrize("case, why", [
    (Case(2, 4, 1, 113, 203, 64, "bfloat16", M.CAUSAL_TL), "causal_tl mask"),
    (Case(2, 4, 4, 113, 203, 64, "float16", M.NONE, alibi=True), "alibi"),
    (Case(1, 4, 1, 64, 150, 256, "float16", M.NONE), "head dims 256/256"),
    (Case(2, 4, 4, 113, 203, 128, "bfloat16", M.NONE, fp8="qkv_tensor"), "FP8"),
])
def test_what_fa4_lacks_is_skipped_with_the_reason(fa4, case: Case, why: str):
    res = check_case(fa4, case, device="cpu")
    assert res.status is Status.SKIPPED and why.lower() in res.message.lower(), res.message


def test_a_wrong_offset_is_refused_not_computed():
    q = torch.zeros(1, 2, 3, 64, dtype=torch.float16)
    for fwd in (lib_peers_fa.flash_attn3_forward, lib_peers_fa.flash_attn4_forward):
        with pytest.raises(ValueError, match="offset"):
            fwd(q, q, q, mask_kind="causal_br", mask=None, key_lengths=None,
                causal_offset=5, scale=0.125)
