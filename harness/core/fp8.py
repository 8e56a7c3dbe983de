"""FP8 inputs: what an `fp8` case hands its candidate, and what those values mean.

Two kinds of case (`Case.fp8`), each with the scale granularities of today's kernels:

- qkv_tensor, qkv_head: the forward of an FP8 attention kernel (FlashAttention-3's FP8
  path). Q, K and V are float8 e4m3 (torch.float8_e4m3fn); the output stays in the case
  dtype (bf16/fp16), the LSE in float32. Dense layout only.
- kv_head, kv_token: an FP8 KV cache (decode and paged serving kernels). K and V are e4m3,
  Q stays in the case dtype; any layout (the paged pool's pages are e4m3).

Descales. The harness owns the scales: it computes them from the drawn inputs and hands
them to the candidate, which cannot choose them. For every e4m3 tensor x it hands a
float32 descale d that broadcasts against x's shape without the last (head) dim:

    value(x)[..., i] = float(x[..., i]) * d[...]      (d[..., None] against x)

    granularity   d's shape                     one scale per
    qkv_tensor    (1, 1, 1)                     tensor
    qkv_head      (B, H, 1) for q, (B, Hkv, 1)  (batch entry, head): FA3's descale_q/k/v
                  for k and v
    kv_head       (1, Hkv, 1)                   K/V head of the whole cache (its pool)
    kv_token      x.shape[:-1]: (B, Hkv, Nk),   key (token) and head: dense, packed, or a
                  (1, Hkv, Tk), (P, Hkv, ps)    page pool's slots

Each scale is amax / E4M3_MAX over its group of the drawn values (1 where the group is
all zeros), so the group's largest element lands on e4m3's largest finite value, 448:
x = e4m3(clamp(drawn / d, -448, 448)), rounded to nearest. A candidate multiplies by d
(a descale: the inverse of the quantisation's scale) wherever it turns the e4m3 values
back into numbers: Q K^T is scaled by d_q * d_k (with the softmax scale), P V by d_v, or
each tile is dequantised as it is loaded.

The oracle (harness.core.reference) computes in float64 from `dequantized` inputs: the
e4m3 values the candidate receives times their descales, both exact in float64 (a 4-bit
significand times a 24-bit one needs 28 bits of float64's 53). The quantisation error of
the inputs is thus part of the problem, not of the candidate's error: a candidate is
judged on what it does with the values it was given.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from harness.core.cases import Case, Inputs


class Fp8(StrEnum):
    NONE = "none"
    QKV_TENSOR = "qkv_tensor"  # Q, K, V e4m3, one descale per tensor
    QKV_HEAD = "qkv_head"  # Q, K, V e4m3, one descale per (batch entry, head)
    KV_HEAD = "kv_head"  # K/V cache e4m3, one descale per K/V head
    KV_TOKEN = "kv_token"  # K/V cache e4m3, one descale per (token, K/V head)

    @property
    def quantizes_q(self) -> bool:
        return self in (Fp8.QKV_TENSOR, Fp8.QKV_HEAD)

    @property
    def is_kv_cache(self) -> bool:
        return self in (Fp8.KV_HEAD, Fp8.KV_TOKEN)


E4M3_MAX = 448.0
DESCALE_NAMES = ("q_descale", "k_descale", "v_descale")


def e4m3() -> torch.dtype:
    import torch

    return torch.float8_e4m3fn


def _group_dims(fp8: Fp8, x: torch.Tensor) -> tuple[int, ...]:
    """The dims of x one scale spans (module doc's table)."""
    if fp8 is Fp8.QKV_TENSOR:
        return tuple(range(x.dim()))
    if fp8 is Fp8.QKV_HEAD:
        return (2, 3)
    if fp8 is Fp8.KV_HEAD:
        return (0, 2, 3)
    return (x.dim() - 1,)


def quantize(fp8: Fp8, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values, float32 descale) of a drawn tensor x (B|P, H, N, d) at `fp8`'s
    granularity (module doc)."""
    import torch

    amax = x.float().abs().amax(dim=_group_dims(fp8, x), keepdim=True)
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q8 = (x.float() / descale).clamp(-E4M3_MAX, E4M3_MAX).to(e4m3())
    return q8, descale.squeeze(-1).contiguous()


def quantize_inputs(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
    """q, k, v of an fp8 case as the candidate gets them (e4m3, or Q in the case dtype
    for a KV cache) and the descales {"q_descale": ..., ...} (None where not e4m3)."""
    fp8 = Fp8(case.fp8)
    descales: dict[str, Any] = dict.fromkeys(DESCALE_NAMES)
    if fp8.quantizes_q:
        q, descales["q_descale"] = quantize(fp8, q)
    else:
        q = q.to(case.torch_dtype)
    k, descales["k_descale"] = quantize(fp8, k)
    v, descales["v_descale"] = quantize(fp8, v)
    return q, k, v, descales


def dequantize(x: torch.Tensor, descale: torch.Tensor | None,
               dtype: torch.dtype) -> torch.Tensor:
    """x's values (module doc) in `dtype`: the product in float64 for float64 (exact),
    else in float32 rounded to `dtype` (what a kernel's tile load does)."""
    import torch

    if descale is None:
        return x.to(dtype)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    return (x.to(wide) * descale.to(device=x.device, dtype=wide)[..., None]).to(dtype)


def dequantized(inputs: Inputs, dtype: torch.dtype) -> Inputs:
    """The inputs with q, k and v replaced by their values in `dtype` (`dequantize`) and
    no descales: the plain attention problem an fp8 case is."""
    import dataclasses

    values = {name: dequantize(getattr(inputs, name), getattr(inputs, f"{name}_descale"),
                               dtype) for name in ("q", "k", "v")}
    return dataclasses.replace(inputs, **values, q_descale=None, k_descale=None,
                               v_descale=None)


def stored_bytes(case: Case) -> tuple[int, int, int]:
    """(bytes of a Q element, of a K/V element, of the descale each K/V row carries) as
    the case's tensors are stored: 1 for e4m3, the dtype's size otherwise; 4 for
    per-token descales (kv_token), else 0 (the IO model's and the models' count)."""
    es = 2  # float16, bfloat16
    fp8 = Fp8(case.fp8)
    return (1 if fp8.quantizes_q else es, 1 if fp8 is not Fp8.NONE else es,
            4 if fp8 is Fp8.KV_TOKEN else 0)


def scalar_descales(case: Case) -> int:
    """Per-tensor or per-head descales a (batch entry, head) reads: q, k, v (3) or a
    cache's k, v (2); per-token ones (0 here) travel with their rows."""
    return {Fp8.QKV_TENSOR: 3, Fp8.QKV_HEAD: 3, Fp8.KV_HEAD: 2}.get(Fp8(case.fp8), 0)


def fp8_problems(case: Case) -> list[str]:
    """What is wrong with a case's fp8 field (its value, its layout)."""
    try:
        fp8 = Fp8(case.fp8)
    except ValueError:
        return [f"fp8 {case.fp8!r} is not one of {[f.value for f in Fp8]}"]
    object.__setattr__(case, "fp8", fp8)
    if fp8.quantizes_q and case.is_serving:
        return ["fp8 q/k/v (qkv_tensor, qkv_head) is for the dense layout only; serving "
                "layouts take an fp8 KV cache (kv_head, kv_token)"]
    return []


def tensor_core_fp8(device: torch.device) -> bool:
    """Whether `device` has FP8 tensor cores (CUDA sm_89 and later) that torch reaches."""
    import torch

    return (device.type == "cuda" and hasattr(torch, "_scaled_mm")
            and torch.cuda.get_device_capability(device) >= (8, 9))


def e4m3_scores(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b^T in float32 for e4m3 values held in float32, a (..., M, d) and b (..., N, d)
    (leading dims broadcast), accumulated as the straightforward FP8 kernel accumulates
    them. On a GPU with FP8 tensor cores that is on them: cuBLASLt's FP8 GEMM with fast
    accumulation, the tensor core's own accumulator over the whole reduction, as a kernel
    issuing its MMAs in a chain has it (it keeps fewer bits than float32 does:
    bench/fp8_accum_probe.py measures how many). Elsewhere in float32 on CUDA cores, where
    every product of two e4m3 values is exact and only the sums round."""
    import torch

    if not tensor_core_fp8(a.device):
        return a @ b.transpose(-1, -2)
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, n, d = a.shape[-2], b.shape[-2], a.shape[-1]

    def flat8(t: torch.Tensor, rows: int) -> torch.Tensor:
        # cuBLASLt's FP8 GEMM takes sizes in multiples of 16: zeros pad them (a zero adds
        # nothing to a dot product), in float32 before the exact cast to e4m3
        t = torch.nn.functional.pad(t.expand(*lead, rows, d), (0, -d % 16, 0, -rows % 16))
        return t.reshape(-1, *t.shape[-2:]).to(e4m3())

    one = torch.ones((), device=a.device)
    out = torch.stack([torch._scaled_mm(x.contiguous(), y.contiguous().t(), scale_a=one,
                                        scale_b=one, out_dtype=torch.float32,
                                        use_fast_accum=True)
                       for x, y in zip(flat8(a, m), flat8(b, n), strict=True)])
    return out[:, :m, :n].reshape(*lead, m, n)
