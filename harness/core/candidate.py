"""The one interface every candidate implements: CPU algorithm models, CUDA kernel
variants from `kernels/`, and the PyTorch SDPA peers.

A candidate never allocates its own outputs: the harness hands it `out` (B, H, Nq, d) in
the case dtype and, when the candidate declares it writes LSE, `lse` (B, H, Nq) float32,
both poisoned beforehand, and checks afterwards that every element was written. A
candidate with a backward (`Support.backward`) gets dQ, dK and dV the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Literal

import torch

from harness.core.cases import Case, GradInputs, Inputs, Layout, MaskKind

Kind = Literal["model", "cuda", "peer", "python"]


@dataclass(frozen=True)
class Support:
    """What a candidate can run. `head_dims` None means any head dim."""

    dtypes: frozenset[str] = frozenset({"float16", "bfloat16"})
    head_dims: frozenset[int] | None = None
    masks: frozenset[MaskKind] = frozenset(MaskKind)
    gqa: bool = True
    writes_lse: bool = True
    # LSE written for a fully masked row: "-inf" (FA3, flex) or "+inf" (FA2's convention).
    masked_lse: Literal["-inf", "+inf"] = "-inf"
    deterministic: bool = True
    max_seqlen_q: int | None = None
    max_seqlen_k: int | None = None
    decode_only: bool = False  # e.g. split-KV decoding kernels that need Nq small
    max_seqlen_q_decode: int = 64
    min_compute_capability: tuple[int, int] = (0, 0)
    # A backward (`Candidate.run_backward`), and whether its repeats are bitwise equal
    # (dQ accumulated by atomics usually is not; a candidate declaring True fails on any
    # difference, others get it reported).
    backward: bool = False
    backward_deterministic: bool = False
    # The mask kinds its backward runs (None: the forward's `masks`). A backward often
    # lags its forward (causal only, no key padding): the cases of a mask it does not
    # declare are skipped with the reason wherever backward cases are chosen.
    backward_masks: frozenset[MaskKind] | None = None
    # The head dims its backward runs (None: the forward's `head_dims`): a forward gains
    # a head dim (256) before its backward does.
    backward_head_dims: frozenset[int] | None = None
    # Serving shapes (harness.core.serving): the layouts it reads (varlen: packed q/k/v
    # with cu_seqlens and seqused; paged: K/V pages behind a block table) and whether it
    # applies a sliding window.
    layouts: frozenset[Layout] = frozenset({Layout.DENSE})
    window: bool = False
    # Score modifiers (harness.core.reference's doc): logit soft-capping, ALiBi biases from
    # per-head slopes, per-head sink logits. A case needing one it does not declare is
    # skipped with the reason.
    softcap: bool = False
    alibi: bool = False
    sinks: bool = False
    # Cases whose V head dim d_v differs from d_qk (`Case.head_dim_v`; both must be among
    # `head_dims` when those are declared).
    head_dim_v: bool = False
    # The (d_qk, d_v) pairs with d_v != d_qk it runs (None: any, when head_dim_v): a
    # kernel built for an MLA prefill's 192 / 128 need not run 128 / 192.
    head_dim_v_pairs: frozenset[tuple[int, int]] | None = None
    # FP8 e4m3 inputs with harness-owned descales (harness.core.fp8): Q, K and V
    # (`fp8`: cases qkv_tensor, qkv_head) or the KV cache with Q in the case dtype
    # (`fp8_kv`: kv_head, kv_token).
    fp8: bool = False
    fp8_kv: bool = False
    # The head dims its e4m3 Q, K, V cases run at (None: all of `head_dims`): an FP8
    # kernel is often built for fewer head dims than its 2-byte one.
    fp8_head_dims: frozenset[int] | None = None

    def reason_unsupported(self, case: Case) -> str | None:
        if case.dtype not in self.dtypes:
            return f"dtype {case.dtype} not supported"
        if self.head_dims is not None and case.head_dim not in self.head_dims:
            return f"head_dim {case.head_dim} not supported (declares {sorted(self.head_dims)})"
        if case.head_dim_v and not self.head_dim_v:
            return "d_v != d_qk not supported (declares head_dim_v = false)"
        if self.head_dims is not None and case.dv not in self.head_dims:
            return f"head_dim_v {case.dv} not supported (declares {sorted(self.head_dims)})"
        if (case.head_dim_v and self.head_dim_v_pairs is not None
                and (case.head_dim, case.dv) not in self.head_dim_v_pairs):
            pairs = ", ".join(f"{a}/{b}" for a, b in sorted(self.head_dim_v_pairs))
            return (f"d_qk/d_v {case.head_dim}/{case.dv} not supported (declares "
                    f"head_dim_v pairs {pairs})")
        if case.mask not in self.masks:
            return f"mask {case.mask.value} not supported"
        if case.layout not in self.layouts:
            return f"{case.layout.value} layout not supported"
        if case.has_window and not self.window:
            return "sliding window not supported"
        for mod, needed in (("softcap", bool(case.softcap)), ("alibi", case.alibi),
                            ("sinks", case.sinks)):
            if needed and not getattr(self, mod):
                return f"score modifier {mod} not supported (declares {mod} = false)"
        if case.fp8.quantizes_q and not self.fp8:
            return "fp8 q/k/v not supported (declares fp8 = false)"
        if (case.fp8.quantizes_q and self.fp8_head_dims is not None
                and case.head_dim not in self.fp8_head_dims):
            return (f"fp8 q/k/v not supported at head_dim {case.head_dim} (declares fp8 at "
                    f"{', '.join(map(str, sorted(self.fp8_head_dims)))})")
        if case.fp8.is_kv_cache and not self.fp8_kv:
            return "fp8 KV cache not supported (declares fp8_kv = false)"
        if not self.gqa and case.kv_heads != case.heads:
            return "GQA/MQA not supported"
        if self.max_seqlen_q is not None and case.seqlen_q > self.max_seqlen_q:
            return f"seqlen_q {case.seqlen_q} > {self.max_seqlen_q}"
        if self.max_seqlen_k is not None and case.seqlen_k > self.max_seqlen_k:
            return f"seqlen_k {case.seqlen_k} > {self.max_seqlen_k}"
        if self.decode_only and case.seqlen_q > self.max_seqlen_q_decode:
            return f"decode kernel: seqlen_q {case.seqlen_q} > {self.max_seqlen_q_decode}"
        return None

    def reason_unsupported_backward(self, case: Case) -> str | None:
        """Why the declared backward does not run `case` (beyond the forward's reasons)."""
        if self.backward_masks is not None and case.mask not in self.backward_masks:
            declared = ", ".join(m.value for m in MaskKind if m in self.backward_masks)
            return (f"its backward does not support mask {case.mask.value} (declares "
                    f"backward masks {declared})")
        dims = self.backward_head_dims
        if dims is not None and (case.head_dim not in dims or case.dv not in dims):
            d = case.head_dim if case.head_dim not in dims else case.dv
            return (f"its backward does not support head_dim {d} (declares backward "
                    f"head dims {', '.join(map(str, sorted(dims)))})")
        return None


@dataclass
class Candidate(ABC):
    name: str
    kind: Kind
    device: Literal["cpu", "cuda"]
    # Key into harness.core.iomodel for the bytes this algorithm moves: "naive_3pass",
    # "naive_fused", "fa1", "fa2", "splitkv" or "ideal" (peers whose algorithm is unknown).
    algorithm: str = "ideal"
    support: Support = field(default_factory=Support)
    description: str = ""
    # Run in a child process with a timeout (CUDA variants, submissions): a crash or hang
    # becomes a verdict instead of taking the run down.
    isolate: bool = False
    # Tile sizes the IO model needs (block_q for FA2, block_k for FA1, splits for split-KV).
    tiles: dict[str, int] = field(default_factory=dict)
    # Manifest-declared workspace, compile resources, source hash... (CUDA variants).
    meta: dict = field(default_factory=dict)

    def supports(self, case: Case) -> str | None:
        """None when the case can run, else the reason it is skipped."""
        return self.support.reason_unsupported(case)

    @abstractmethod
    def run(self, case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None) -> None:
        """Compute attention for `case` into the harness-owned `out` (and `lse`)."""

    def supports_backward(self, case: Case) -> str | None:
        """None when the backward can run `case` (beyond `supports`), else the reason it
        is skipped (a library backend that refuses the backward of a case it runs
        forward)."""
        return None

    def backward_unsupported(self, case: Case) -> str | None:
        """Why the backward does not run `case` beyond `supports`: what the declaration
        says (`Support.reason_unsupported_backward`: its masks), then `supports_backward`.
        Every place that chooses or runs backward cases asks this."""
        return self.support.reason_unsupported_backward(case) or self.supports_backward(case)

    def run_backward(self, case: Case, inputs: GradInputs, dq: torch.Tensor, dk: torch.Tensor,
                     dv: torch.Tensor) -> None:
        """Compute dQ, dK, dV of `case` into the harness-owned buffers, from the forward's
        inputs, output, LSE and the output gradient in `inputs` (which it must not
        modify). Only for candidates whose `support.backward` is True."""
        raise NotImplementedError(f"{self.name} declares no backward")

    def take_notes(self) -> list[str]:
        """What the candidate said about its runs since the last call (a fallback path it
        took for this shape, say): kept with the case's result, so a record shows how the
        number was obtained. Most candidates have nothing to say."""
        return []
