"""Attention libraries a team may have installed, as peers through the Python candidate
protocol (harness.candidates.python_candidate), registered by the project's entry points
only when the library can be imported: where it cannot, the entry point returns no
candidate (and `fa-harness kernels` lists none).

flash_attn (FlashAttention 2.6+, `flash_attn.flash_attn_func`): the dense layout, masks
none and causal (FlashAttention's causal mask is bottom-right aligned, the harness's
causal_br), sliding windows (`window_size`, aligned bottom-right like the harness's),
softcap (the cap on the scaled score), ALiBi (`alibi_slopes`: the bias -slope |i + Nk -
Nq - j|, the harness's with its bottom-right offset), GQA/MQA, fp16 and bf16, head dims
up to 256, and its backward through autograd. The LSE comes from `return_attn_probs=True`
(with no dropout the library returns (out, softmax_lse, None)); a row that sees no key
has LSE +inf. Skipped with the reason: causal_tl, key padding and random masks, sinks,
d_v != d_qk, FP8 (FlashAttention 2 has none of them), varlen and paged layouts (not
wired yet: `flash_attn_varlen_func`, `flash_attn_with_kvcache`).

flashinfer (`flashinfer.single_prefill_with_kv_cache_return_lse`, one call per batch entry:
its single-request API, with q as (Nq, H, d) and k, v in its HND layout, (Hkv, Nk, d)):
masks none and causal (bottom-right, as its append attention aligns it), key padding (each
batch entry's keys cut to its length; an entry with none gets O = 0 and LSE -inf without
a call), a left window under the causal mask (`window_left`), softcap
(`logits_soft_cap`, on the scaled score), GQA/MQA, d_qk = 192 with d_v = 128, and e4m3
Q, K, V with per-head scales (`scale_q`, `scale_k`, `scale_v`; the harness's per-tensor
and per-(batch entry, head) descales are both per-head within an entry), O in the case
dtype. Its LSE is in base 2 (`return_lse`), turned into natural log. Skipped with the
reason: causal_tl and random masks, windows without the causal mask or with a right
extent, ALiBi (its slopes are its own, not an input), sinks, FP8 KV caches, the serving
layouts (its batch wrappers are not wired). The loop over batch entries and q's copy into
its layout are in the timed call: fair at batch 1, not at 32.

These adapters are checked on the CPU against stand-ins that follow each library's
documented API (tests/test_lib_peers.py); none of the libraries is installed where the
project's GPU runs are made, so no record holds them yet (docs/python-candidates.md).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from harness.candidates.python_candidate import PythonKernel, autograd_backward
from harness.core.cases import Case

FA2_MAX_HEAD_DIM = 256


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _on_cuda(device: str, library: str) -> Callable[[], str | None]:
    """The `available` of a peer whose library runs on CUDA only (`device` "cpu" is for
    tests, against a stand-in)."""
    def available() -> str | None:
        if device == "cuda" and not torch.cuda.is_available():
            return f"needs a CUDA GPU ({library} runs on CUDA only)"
        return None
    return available


def flash_attn_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask_kind: str,
                       mask: Any, key_lengths: Any, causal_offset: int, scale: float,
                       window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                       alibi_slopes: torch.Tensor | None = None,
                       **_serving: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The harness's call (q (B, H, Nq, d), k and v (B, Hkv, Nk, d)) as flash_attn_func's
    (B, N, H, d) views, and its result back as (out (B, H, Nq, d), lse (B, H, Nq))."""
    nq, nk = q.shape[2], k.shape[2]
    if mask_kind not in ("none", "causal_br"):
        raise ValueError(f"flash_attn peer: mask {mask_kind} is not supported")
    if mask_kind == "causal_br" and causal_offset != nk - nq:
        # Its causal mask is bottom-right aligned, as the harness's causal_br of a dense
        # case is; its window and ALiBi are too, as the harness's are for every mask but
        # causal_tl (python_candidate's doc).
        raise ValueError(f"flash_attn peer: causal offset {causal_offset} is not Nk - Nq")
    from flash_attn import flash_attn_func

    out, lse, _ = flash_attn_func(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=0.0,
        softmax_scale=scale, causal=mask_kind == "causal_br",
        window_size=(window_left, window_right), softcap=softcap,
        alibi_slopes=alibi_slopes, deterministic=False, return_attn_probs=True)
    return out.transpose(1, 2), lse


def flash_attn_supports(case: Case) -> str | None:
    """Why flash_attn_func cannot run `case`, in the library's terms (None: it can)."""
    if case.mask.value not in ("none", "causal_br"):
        return (f"flash_attn_func has no {case.mask.value} mask (causal is bottom-right; "
                "no boolean mask or per-batch key lengths in the dense API)")
    if case.head_dim > FA2_MAX_HEAD_DIM or case.head_dim % 8:
        return f"flash_attn_func takes head dims up to {FA2_MAX_HEAD_DIM}, multiples of 8"
    return None


def flash_attn_candidates(device: str | None = None) -> list[PythonKernel]:
    """The flash_attn peer when `flash_attn` imports (none otherwise). `device` is for
    tests only: the library runs on CUDA."""
    if not _importable("flash_attn"):
        return []
    device = device or "cuda"

    return [PythonKernel(
        name="flash_attn", fn=flash_attn_forward, device=device,  # type: ignore[arg-type]
        dtypes=("float16", "bfloat16"), head_dims=None, masks=("none", "causal_br"),
        gqa=True, lse="+inf", deterministic=True, algorithm="fa2",
        description="FlashAttention 2 (flash_attn.flash_attn_func), an installed library: "
                    "causal bottom-right, sliding windows, softcap, ALiBi, GQA",
        available=_on_cuda(device, "flash_attn"), supports=flash_attn_supports, window=True,
        softcap=True, alibi=True, yardstick=True,
        # dQ by atomics in the library's backward: not bitwise repeatable
        backward_prepare=autograd_backward(flash_attn_forward), backward_deterministic=False,
        backward_window=True)]


FLASHINFER_HEAD_DIMS = frozenset({(64, 64), (128, 128), (256, 256), (192, 128)})
_LN2 = 0.6931471805599453


def flashinfer_prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask_kind: str,
                       mask: Any, key_lengths: Any, causal_offset: int, scale: float,
                       window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                       q_descale: torch.Tensor | None = None,
                       k_descale: torch.Tensor | None = None,
                       v_descale: torch.Tensor | None = None,
                       out_dtype: torch.dtype | None = None,
                       **_serving: Any) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """The harness's call as one flashinfer call per batch entry (q (B, H, Nq, d), k and v
    (B, Hkv, Nk, d)); the returned call gives (out (B, H, Nq, d_v), lse (B, H, Nq))."""
    b, h, nq, _ = q.shape
    hk, nk, dv = k.shape[1], k.shape[2], v.shape[-1]
    if mask_kind not in ("none", "causal_br", "key_padding"):
        raise ValueError(f"flashinfer peer: mask {mask_kind} is not supported")
    if mask_kind == "causal_br" and causal_offset != nk - nq:
        raise ValueError(f"flashinfer peer: causal offset {causal_offset} is not Nk - Nq")
    if window_right >= 0 and not (mask_kind == "causal_br" and window_right == 0):
        raise ValueError("flashinfer peer: no right window extent")
    from flashinfer import single_prefill_with_kv_cache_return_lse as prefill

    o_dtype = out_dtype or q.dtype   # out_dtype comes with e4m3 inputs (q is e4m3 then)
    lengths = key_lengths.tolist() if key_lengths is not None else [nk] * b

    def per_head(d: torch.Tensor, i: int, heads: int) -> torch.Tensor:
        # (1, 1, 1) per tensor or (B, heads, 1) per entry and head: per head within entry i
        return d[min(i, d.shape[0] - 1), :, 0].expand(heads).contiguous()

    calls = []
    for i in range(b):
        scales = {}
        if q_descale is not None:   # e4m3 Q, K and V (the only FP8 cases it declares)
            scales = {"scale_q": per_head(q_descale, i, h),
                      "scale_k": per_head(k_descale, i, hk),  # type: ignore[arg-type]
                      "scale_v": per_head(v_descale, i, hk)}  # type: ignore[arg-type]
        n = int(lengths[i])
        calls.append((q[i].transpose(0, 1).contiguous(), k[i, :, :n], v[i, :, :n], n, scales))

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        outs, lses = [], []
        for qi, ki, vi, n, scales in calls:
            if n == 0:   # no key: O = 0, LSE = -inf (no call on an empty cache)
                outs.append(torch.zeros(h, nq, dv, dtype=o_dtype, device=q.device))
                lses.append(torch.full((h, nq), float("-inf"), device=q.device))
                continue
            o, lse = prefill(qi, ki, vi, **scales, o_dtype=o_dtype,
                             causal=mask_kind == "causal_br", kv_layout="HND", sm_scale=scale,
                             window_left=window_left,
                             logits_soft_cap=softcap if softcap > 0 else None, return_lse=True)
            outs.append(o.transpose(0, 1))
            lses.append(lse.transpose(0, 1).float() * _LN2)   # base 2 -> natural log
        return torch.stack(outs), torch.stack(lses)

    return run


def flashinfer_supports(case: Case) -> str | None:
    """Why flashinfer's single prefill cannot run `case`, in the library's terms."""
    if case.mask.value not in ("none", "causal_br", "key_padding"):
        return (f"flashinfer has no {case.mask.value} mask here (its causal is bottom-right; "
                "a custom mask is not wired)")
    if (case.head_dim, case.dv) not in FLASHINFER_HEAD_DIMS:
        return f"flashinfer's prefill: head dims {case.head_dim}/{case.dv} not built"
    if case.has_window and not (case.mask.value == "causal_br" and case.window_right in (-1, 0)):
        return "flashinfer has a left window under the causal mask only (window_left)"
    if case.fp8.is_kv_cache:
        return "flashinfer's single prefill: e4m3 Q, K, V, not an e4m3 cache with Q in fp16/bf16"
    return None


def _flashinfer_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return flashinfer_prepare(q, k, v, **kw)()


def flashinfer_candidates(device: str | None = None) -> list[PythonKernel]:
    """The flashinfer peer when `flashinfer` imports (none otherwise). `device` is for
    tests only: the library runs on CUDA."""
    if not _importable("flashinfer"):
        return []
    device = device or "cuda"

    return [PythonKernel(
        name="flashinfer", fn=_flashinfer_forward, prepare=flashinfer_prepare,
        device=device,  # type: ignore[arg-type]
        dtypes=("float16", "bfloat16"), head_dims=(64, 128, 192, 256),
        masks=("none", "causal_br", "key_padding"), gqa=True, lse="-inf",
        deterministic=True, algorithm="fa2",
        description="FlashInfer (single_prefill_with_kv_cache_return_lse per batch entry), "
                    "an installed library: causal bottom-right, key padding, left windows, "
                    "softcap, GQA, d 192/128, e4m3 Q/K/V with per-head scales",
        available=_on_cuda(device, "flashinfer"), supports=flashinfer_supports, window=True,
        softcap=True, head_dim_v=True, fp8=True, yardstick=True)]
