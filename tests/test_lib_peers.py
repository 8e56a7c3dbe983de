"""The installed-library peers (harness.candidates.lib_peers) on the CPU: registered only
where the library imports, and their argument mapping judged by the harness's own checks
against a stand-in module that computes what the library's documentation says its
function computes (FlashAttention 2's flash_attn_func: (B, N, H, d) tensors, causal and
window bottom-right aligned, softcap on the scaled score, ALiBi -slope |i + Nk - Nq - j|,
LSE +inf for a row that sees no key)."""

from __future__ import annotations

import sys

import pytest
import torch
from lib_standins import attend, stand_in

from harness.candidates import lib_peers
from harness.candidates.python_candidate import to_candidate
from harness.core.cases import Case, MaskKind
from harness.core.check import check_case
from harness.core.check_grad import check_backward_case
from harness.core.results import Status

M = MaskKind


def _flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,  # noqa: ANN001
                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                     deterministic=False, return_attn_probs=False):
    """FlashAttention 2's flash_attn_func as its docstring states it, in float32."""
    assert dropout_p == 0.0 and q.stride(-1) == 1 and k.stride(-1) == 1
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out, lse = attend(q, k, v, scale, causal, *window_size, softcap, empty_lse=float("inf"),
                      alibi_slopes=alibi_slopes)
    out = out.to(q.dtype)
    return (out, lse, None) if return_attn_probs else out


@pytest.fixture
def flash_attn(monkeypatch):
    stand_in(monkeypatch, "flash_attn", flash_attn_func=_flash_attn_func)
    (peer,) = lib_peers.flash_attn_candidates(device="cpu")
    return to_candidate(peer, "test")


def test_no_library_no_candidate(monkeypatch):
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    if lib_peers._importable("flash_attn"):
        pytest.skip("flash_attn is installed here")
    assert lib_peers.flash_attn_candidates() == []


CASES = [
    Case(2, 4, 4, 113, 203, 64, "float16", M.NONE),
    Case(2, 4, 2, 203, 113, 64, "bfloat16", M.CAUSAL_BR),  # fully masked rows: LSE +inf
    Case(2, 6, 2, 113, 203, 128, "float16", M.CAUSAL_BR, softcap=10.0),
    Case(2, 4, 1, 113, 203, 64, "bfloat16", M.NONE, alibi=True),
    Case(2, 4, 2, 113, 203, 64, "float16", M.CAUSAL_BR, window_left=48, alibi=True),
    Case(2, 4, 4, 113, 203, 64, "float16", M.NONE, window_left=32, window_right=8),
    Case(1, 4, 4, 113, 203, 96, "float16", M.NONE),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_peer_passes_the_harness_checks(flash_attn, case: Case):
    assert flash_attn.supports(case) is None
    res = check_case(flash_attn, case, device="cpu")
    assert res.status is Status.PASSED, res.message


@pytest.mark.parametrize("case, why", [
    (Case(2, 4, 1, 113, 203, 64, "bfloat16", M.CAUSAL_TL), "causal_tl mask"),
    (Case(3, 4, 2, 97, 130, 64, "float16", M.KEY_PADDING), "key_padding mask"),
    (Case(2, 4, 4, 113, 203, 64, "float16", M.NONE, sinks=True), "sink"),
    (Case(2, 4, 4, 113, 203, 192, "float16", M.NONE, head_dim_v=128), "d_v"),
])
def test_what_the_library_lacks_is_skipped_with_the_reason(flash_attn, case: Case, why: str):
    res = check_case(flash_attn, case, device="cpu")
    assert res.status is Status.SKIPPED and why in res.message, res.message


def test_a_wrong_offset_is_refused_not_computed():
    q = torch.zeros(1, 2, 3, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="offset"):
        lib_peers.flash_attn_forward(q, q, q, mask_kind="causal_br", mask=None,
                                     key_lengths=None, causal_offset=5, scale=0.125)


def test_its_backward_through_autograd_passes(flash_attn):
    case = Case(2, 4, 2, 113, 203, 64, "float16", M.CAUSAL_BR)
    res = check_backward_case(flash_attn, case, device="cpu")
    assert res.status is Status.PASSED, res.message


def test_it_is_a_yardstick_unless_named(flash_attn):
    from harness.candidates.registry import owned

    assert not owned(flash_attn, yardsticks=())
    assert owned(flash_attn, named=["flash_attn"], yardsticks=())


# --- flashinfer ------------------------------------------------------------------------
def _single_prefill_return_lse(q, k, v, scale_q=None, scale_k=None, scale_v=None,  # noqa: ANN001
                               o_dtype=None, custom_mask=None, causal=False, kv_layout="NHD",
                               pos_encoding_mode="NONE", sm_scale=None, window_left=-1,
                               logits_soft_cap=None, return_lse=True):
    """flashinfer.single_prefill_with_kv_cache_return_lse as its documentation states it, in
    float32: q (qo_len, H, d_qk); k, v (Hkv, kv_len, d) in HND; per-head FP8 scales; causal
    aligned bottom-right (append attention); window_left keys back from the diagonal; the
    soft cap on the scaled logits; LSE in base 2."""
    assert kv_layout == "HND" and custom_mask is None and pos_encoding_mode == "NONE"
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    nq, h, d = q.shape
    hk, nk = k.shape[0], k.shape[1]
    assert nk > 0
    qf, kf, vf = q.float(), k.float(), v.float()
    if scale_q is not None:
        qf = qf * scale_q[None, :, None]
        kf = kf * scale_k[:, None, None]
        vf = vf * scale_v[:, None, None]
    scale = sm_scale if sm_scale is not None else d ** -0.5
    qf = qf.transpose(0, 1)
    kf = kf.repeat_interleave(h // hk, dim=0)
    vf = vf.repeat_interleave(h // hk, dim=0)
    s = qf @ kf.transpose(-1, -2) * scale
    if logits_soft_cap:
        s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    vis = torch.ones(nq, nk, dtype=torch.bool)
    if causal:
        vis &= j <= i + nk - nq
    if window_left >= 0:
        vis &= j >= i + nk - nq - window_left
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = (p @ vf).transpose(0, 1).to(o_dtype or q.dtype)
    return out, (lse / 0.6931471805599453).transpose(0, 1)


@pytest.fixture
def flashinfer(monkeypatch):
    stand_in(monkeypatch, "flashinfer",
              single_prefill_with_kv_cache_return_lse=_single_prefill_return_lse)
    (peer,) = lib_peers.flashinfer_candidates(device="cpu")
    return to_candidate(peer, "test")


def test_no_flashinfer_no_candidate(monkeypatch):
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    if lib_peers._importable("flashinfer"):
        pytest.skip("flashinfer is installed here")
    assert lib_peers.flashinfer_candidates() == []


FI_CASES = [
    Case(2, 4, 4, 113, 203, 64, "float16", M.NONE),
    Case(2, 4, 2, 203, 113, 128, "bfloat16", M.CAUSAL_BR),  # rows seeing no key: LSE -inf
    Case(3, 4, 2, 97, 130, 64, "float16", M.KEY_PADDING),    # an entry with no key
    Case(2, 6, 2, 113, 203, 128, "float16", M.CAUSAL_BR, softcap=10.0),
    Case(2, 4, 2, 113, 203, 64, "bfloat16", M.CAUSAL_BR, window_left=48),
    Case(2, 4, 4, 113, 203, 192, "bfloat16", M.NONE, head_dim_v=128),
    Case(1, 4, 1, 64, 150, 256, "float16", M.CAUSAL_BR),
    Case(2, 4, 2, 113, 203, 128, "bfloat16", M.CAUSAL_BR, fp8="qkv_head"),
    Case(2, 4, 4, 70, 150, 128, "float16", M.NONE, fp8="qkv_tensor"),
]


@pytest.mark.parametrize("case", FI_CASES, ids=lambda c: c.id)
def test_the_flashinfer_peer_passes_the_harness_checks(flashinfer, case: Case):
    assert flashinfer.supports(case) is None
    res = check_case(flashinfer, case, device="cpu")
    assert res.status is Status.PASSED, res.message


@pytest.mark.parametrize("case, why", [
    (Case(2, 4, 1, 113, 203, 64, "bfloat16", M.CAUSAL_TL), "causal_tl mask"),
    (Case(2, 4, 4, 64, 150, 64, "bfloat16", M.RANDOM), "random mask"),
    (Case(2, 4, 4, 113, 203, 64, "float16", M.NONE, alibi=True), "alibi"),
    (Case(2, 4, 4, 113, 203, 64, "float16", M.NONE, sinks=True), "sink"),
    (Case(2, 4, 4, 113, 203, 64, "float16", M.NONE, window_left=32, window_right=8),
     "left window under the causal mask"),
    (Case(2, 4, 4, 113, 203, 96, "float16", M.NONE), "head dims 96/96"),
    (Case(2, 4, 4, 113, 203, 128, "float16", M.NONE, head_dim_v=192), "128/192"),
    (Case(1, 8, 2, 1, 239, 128, "bfloat16", M.NONE, fp8="kv_head"), "e4m3 cache"),
])
def test_what_flashinfer_lacks_is_skipped_with_the_reason(flashinfer, case: Case, why: str):
    res = check_case(flashinfer, case, device="cpu")
    assert res.status is Status.SKIPPED and why in res.message, res.message
