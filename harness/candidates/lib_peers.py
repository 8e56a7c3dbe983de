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

These adapters are checked on the CPU against stand-ins that follow each library's
documented API (tests/test_lib_peers.py); none of the libraries is installed where the
project's GPU runs are made, so no record holds them yet (docs/python-candidates.md).
"""

from __future__ import annotations

import importlib.util
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

    def available() -> str | None:
        if device == "cuda" and not torch.cuda.is_available():
            return "needs a CUDA GPU (flash_attn runs on CUDA only)"
        return None

    return [PythonKernel(
        name="flash_attn", fn=flash_attn_forward, device=device,  # type: ignore[arg-type]
        dtypes=("float16", "bfloat16"), head_dims=None, masks=("none", "causal_br"),
        gqa=True, lse="+inf", deterministic=True, algorithm="fa2",
        description="FlashAttention 2 (flash_attn.flash_attn_func), an installed library: "
                    "causal bottom-right, sliding windows, softcap, ALiBi, GQA",
        available=available, supports=flash_attn_supports, window=True,
        softcap=True, alibi=True, yardstick=True,
        # dQ by atomics in the library's backward: not bitwise repeatable
        backward_prepare=autograd_backward(flash_attn_forward), backward_deterministic=False,
        backward_window=True)]
