"""FlashAttention 3 and 4 as installed-library peers (lib_peers' doc: registered by the
project's entry points only where the library imports; checked on the CPU against
stand-ins that follow each library's documented API, tests/test_lib_peers_fa.py).

flash_attn3 (`flash_attn_interface.flash_attn_func`, the Hopper build of FlashAttention
3): (B, N, H, d) tensors; masks none and causal (bottom-right, the harness's causal_br);
sliding windows (`window_size`, bottom-right aligned); softcap on the scaled score; GQA/MQA;
head dims up to 256 and d_qk = 192 with d_v = 128; e4m3 Q, K, V with descales of shape
(B, Hkv) (`q_descale`, `k_descale`, `v_descale`). Its FP8 forward writes O in bf16, so
only bf16 FP8 cases run, and a per-head Q descale is per KV head there: an FP8 case with
per-head descales runs only where H = Hkv. With one split (`num_splits=1`, asked for) a
row that sees no key has LSE +inf, as FlashAttention 2's. Skipped with the reason:
causal_tl, key padding and random masks, ALiBi, sinks (neither in its interface), FP8 KV
caches, the serving layouts (`flash_attn_varlen_func` and `flash_attn_with_kvcache` are
not wired). Its backward through autograd (2-byte cases; no window in the backward, which
its interface refuses for some shapes).

flash_attn4 (`flash_attn.cute.flash_attn_func`, FlashAttention 4 in CuTe DSL, for Hopper
and Blackwell): the same layout, masks none and causal_br, windows (`window_size`, None
for an unbounded side), softcap, GQA/MQA, learnable sinks (`learnable_sink`, (H,), a logit
in the units of the scaled score that joins the softmax's denominator: the harness's), and
d_qk = 192 with d_v = 128. Its LSE, asked for with `return_lse=True` where the installed
version has that keyword (else it comes only when an input requires gradients, so q is
given as one that does), is -inf for a row that sees no key. The sink logits go in as the
harness draws them, float32: a version that insists on bf16 fails those cases with its own
message (rounding them here would change the problem it is judged on). Skipped with
the reason: causal_tl, key padding and random masks, ALiBi, FP8, the serving layouts.
Head dims: whatever the installed version builds for the GPU it runs on; a shape it lacks
fails in the library, with its message.

Neither library is installed where the project's GPU runs are made (each is a compiled
build for one CUDA and torch), so no record holds them yet.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from harness.candidates.lib_peers import _importable, _on_cuda
from harness.candidates.python_candidate import PythonKernel, autograd_backward
from harness.core.cases import Case

FA3_HEAD_DIMS = frozenset({(64, 64), (96, 96), (128, 128), (192, 192), (256, 256),
                           (192, 128)})
FA4_HEAD_DIMS = frozenset({(64, 64), (96, 96), (128, 128), (192, 128)})


def _dense_mask(peer: str, mask_kind: str, causal_offset: int, nq: int, nk: int) -> bool:
    """Whether the call is causal; refuses what the library cannot say (a mask beyond none
    and causal_br, or a causal offset that is not its bottom-right Nk - Nq)."""
    if mask_kind not in ("none", "causal_br"):
        raise ValueError(f"{peer} peer: mask {mask_kind} is not supported")
    if mask_kind == "causal_br" and causal_offset != nk - nq:
        raise ValueError(f"{peer} peer: causal offset {causal_offset} is not Nk - Nq")
    return mask_kind == "causal_br"


def _fa3_descale(d: torch.Tensor | None, b: int, hk: int) -> torch.Tensor | None:
    """The harness's descale ((1, 1, 1) per tensor, (B, heads, 1) per head) as FA3's
    (B, Hkv) float32; a per-head Q descale is taken per KV head (supports() runs such a
    case only where H = Hkv)."""
    if d is None:
        return None
    return d[..., 0].float().expand(b, hk).contiguous()


def flash_attn3_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask_kind: str,
                        mask: Any, key_lengths: Any, causal_offset: int, scale: float,
                        window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                        q_descale: torch.Tensor | None = None,
                        k_descale: torch.Tensor | None = None,
                        v_descale: torch.Tensor | None = None,
                        out_dtype: torch.dtype | None = None,
                        **_serving: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The harness's call (q (B, H, Nq, d), k and v (B, Hkv, Nk, d)) as FA3's flash_attn_func
    on (B, N, H, d) views, and (out (B, H, Nq, d_v), lse (B, H, Nq)) back."""
    b, _, nq, _ = q.shape
    hk, nk = k.shape[1], k.shape[2]
    causal = _dense_mask("flash_attn3", mask_kind, causal_offset, nq, nk)
    if q_descale is not None and out_dtype not in (None, torch.bfloat16):
        raise ValueError("flash_attn3 peer: its FP8 forward writes O in bf16 only")
    from flash_attn_interface import flash_attn_func

    out, lse = flash_attn_func(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale,
        causal=causal, q_descale=_fa3_descale(q_descale, b, hk),
        k_descale=_fa3_descale(k_descale, b, hk), v_descale=_fa3_descale(v_descale, b, hk),
        window_size=(window_left, window_right), softcap=softcap, num_splits=1,
        return_attn_probs=True)
    return out.transpose(1, 2), lse


def flash_attn3_supports(case: Case) -> str | None:
    """Why FA3's flash_attn_func cannot run `case`, in the library's terms (None: it can)."""
    if case.mask.value not in ("none", "causal_br"):
        return (f"flash_attn_interface has no {case.mask.value} mask (causal is bottom-right; "
                "no boolean mask or per-batch key lengths in the dense API)")
    if (case.head_dim, case.dv) not in FA3_HEAD_DIMS:
        return f"flash_attn_interface: head dims {case.head_dim}/{case.dv} not built"
    if case.fp8.is_kv_cache:
        return "flash_attn_interface: e4m3 Q, K, V, not an e4m3 cache with Q in fp16/bf16"
    if case.fp8.value != "none" and case.dtype != "bfloat16":
        return "flash_attn_interface's FP8 forward writes O in bf16 only"
    if case.fp8.value == "qkv_head" and case.heads != case.kv_heads:
        return "flash_attn_interface's Q descale is per KV head (B, Hkv): no per-Q-head descale"
    return None


def flash_attn3_candidates(device: str | None = None) -> list[PythonKernel]:
    """The flash_attn3 peer when `flash_attn_interface` imports (none otherwise). `device`
    is for tests only: the library runs on CUDA."""
    if not _importable("flash_attn_interface"):
        return []
    device = device or "cuda"
    return [PythonKernel(
        name="flash_attn3", fn=flash_attn3_forward, device=device,  # type: ignore[arg-type]
        dtypes=("float16", "bfloat16"), head_dims=(64, 96, 128, 192, 256),
        masks=("none", "causal_br"), gqa=True, lse="+inf", deterministic=True,
        algorithm="fa2",
        description="FlashAttention 3 (flash_attn_interface.flash_attn_func), an installed "
                    "library: causal bottom-right, sliding windows, softcap, GQA, d 192/128, "
                    "e4m3 Q/K/V with (B, Hkv) descales",
        available=_on_cuda(device, "flash_attn_interface"), supports=flash_attn3_supports,
        window=True, softcap=True, head_dim_v=True, fp8=True, yardstick=True,
        backward_prepare=autograd_backward(flash_attn3_forward), backward_deterministic=False)]


def _takes(fn: Callable[..., Any], keyword: str) -> bool:
    try:
        return keyword in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def flash_attn4_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask_kind: str,
                        mask: Any, key_lengths: Any, causal_offset: int, scale: float,
                        window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                        sinks: torch.Tensor | None = None,
                        **_serving: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The harness's call as FA4's flash_attn_func on (B, N, H, d) views; (out, lse) back."""
    nq, nk = q.shape[2], k.shape[2]
    causal = _dense_mask("flash_attn4", mask_kind, causal_offset, nq, nk)
    from flash_attn.cute import flash_attn_func

    qt = q.transpose(1, 2)
    kw: dict[str, Any] = {}
    if _takes(flash_attn_func, "return_lse"):
        kw["return_lse"] = True
    elif not qt.requires_grad:
        # Older versions allocate the LSE only for an input that requires gradients.
        qt = qt.detach().requires_grad_()
    window = (None if window_left < 0 else window_left, None if window_right < 0 else window_right)
    with torch.enable_grad() if qt.requires_grad else torch.no_grad():
        out, lse = flash_attn_func(qt, k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale,
                                   causal=causal, window_size=window, learnable_sink=sinks,
                                   softcap=softcap, **kw)
    if lse is None:
        raise RuntimeError("flash_attn4 peer: the library returned no LSE")
    if not q.requires_grad:
        out, lse = out.detach(), lse.detach()
    return out.transpose(1, 2), lse


def flash_attn4_supports(case: Case) -> str | None:
    """Why FA4's flash_attn_func cannot run `case`, in the library's terms (None: it can)."""
    if case.mask.value not in ("none", "causal_br"):
        return (f"flash_attn.cute has no {case.mask.value} mask here (causal is bottom-right; "
                "its mask_mod is not wired)")
    if (case.head_dim, case.dv) not in FA4_HEAD_DIMS:
        return f"flash_attn.cute: head dims {case.head_dim}/{case.dv} not among its builds"
    if case.fp8.value != "none":
        return "flash_attn.cute: no FP8 forward on Hopper"
    return None


def flash_attn4_candidates(device: str | None = None) -> list[PythonKernel]:
    """The flash_attn4 peer when `flash_attn.cute` imports (none otherwise)."""
    if not _importable("flash_attn.cute"):
        return []
    device = device or "cuda"
    return [PythonKernel(
        name="flash_attn4", fn=flash_attn4_forward, device=device,  # type: ignore[arg-type]
        dtypes=("float16", "bfloat16"), head_dims=(64, 96, 128, 192),
        masks=("none", "causal_br"), gqa=True, lse="-inf", deterministic=True,
        algorithm="fa2",
        description="FlashAttention 4 (flash_attn.cute.flash_attn_func), an installed "
                    "library: causal bottom-right, sliding windows, softcap, learnable sinks, "
                    "GQA, d 192/128",
        available=_on_cuda(device, "flash_attn.cute"), supports=flash_attn4_supports,
        window=True, softcap=True, sinks=True, head_dim_v=True, yardstick=True)]
