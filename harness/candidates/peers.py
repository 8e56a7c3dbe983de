"""PyTorch SDPA backends as candidates (kind "peer"): the yardsticks our kernels are
ranked against, held to the same correctness check.

`sdpa_flash`, `sdpa_cudnn`, `sdpa_efficient` and `sdpa_math` each force one backend with
`torch.nn.attention.sdpa_kernel`. Reporting is honest in both directions:
- a backend that refuses a case (torch raises "No available kernel" and warns why) is an
  unsupported case, skipped with the backend's own reason. Support is decided by trying
  the case (batch 1) once per case signature, not by a hand-kept table that would drift
  from torch's real rules;
- a backend that runs and returns wrong values is not excused: it goes through the normal
  check and fails (cuDNN returns mean(V), not 0, for a fully masked row).

Masks: top-left causal is `is_causal=True` (PyTorch's own convention). Bottom-right causal
is the same thing when Nq == Nk; otherwise each backend gets its own faithful route,
because `torch.nn.attention.bias.causal_lower_right` picks flash or mem-efficient by
capability regardless of `sdpa_kernel`, which would let one peer silently run another's
kernel: flash runs its aten op, whose causal flag is bottom-right; mem-efficient runs its
aten op with the lower-right mask type; cuDNN and math get the materialised
`causal_lower_right` mask. Key padding and random masks are a boolean `attn_mask`.
GQA uses `enable_gqa=True`, or K/V repeated per head where a backend refuses that.

Serving shapes: a sliding window on the dense layout is a boolean `attn_mask` too (the
band of harness.core.serving with its causal limit and alignment, and-ed with a key
padding or random mask), offered to every backend like the masks above: the ones that
take an arbitrary mask run it (efficient, math; cuDNN runs it and fails the check on the
rows the window leaves empty, mean(V) again), flash refuses and is skipped with torch's
reason ("sliding window as a boolean attn_mask: Flash Attention does not support
non-null attn_mask", torch 2.11). Varlen and paged cases are skipped with the reason
(LAYOUT_REASONS): SDPA has no cu_seqlens or block-table API.

Score modifiers (harness.candidates.peer_mods): ALiBi is a float `attn_mask` (the bias,
-inf where the mask or window hides a key), offered to every backend; softcap and sinks
are skipped with the reason (SDPA has no hook for either). V may have its own head dim
(d_v != d_qk), offered to every backend too: one that refuses it is skipped.

Peers do not write LSE (`writes_lse=False`); the output is checked.

The backward of each backend is torch.autograd through its forward, run under the same
`sdpa_kernel` (the forward's autograd node names the backend's backward kernel): the
forward runs in the preparation, the timed call is the backward alone. A backend that
refuses the backward of a case is a skip with its reason (probed once per signature, as
the forward); only math's backward is declared bitwise deterministic.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.candidates.peer_mods import alibi_mask, mod_reason
from harness.core.candidate import Candidate, Support
from harness.core.cases import (
    Case,
    GradInputs,
    Inputs,
    Layout,
    MaskKind,
    make_grad_output,
    make_inputs,
)

# The math backend materialises the B*H*Nq*Nk score matrix (fp32); past this it is not
# a meaningful peer, only a way to run out of memory.
MATH_SCORE_LIMIT_BYTES = 8 << 30

REFUSAL_MARKERS = ("No available kernel", "No viable backend")


class BackendRefused(RuntimeError):
    """The forced backend cannot run this case; the message is its reason."""


def _backend(name: str):
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]


def _signature(case: Case, device: str) -> tuple:
    # Everything torch's backend selection looks at (a window is a mask); batch and seed
    # do not matter.
    # ALiBi's float mask and V's own head dim are refused by some backends.
    return (device, case.dtype, case.head_dim, case.mask, case.heads, case.kv_heads,
            case.seqlen_q, case.seqlen_k, case.window_left, case.window_right, case.alibi,
            case.dv)


def _probe_case(case: Case) -> Case:
    """The batch-1 copy of a case support is decided on (window and all)."""
    return dataclasses.replace(case, batch=1)


# SDPA takes (B, H, N, d) tensors with one Nq x Nk per call: no cu_seqlens, no block
# table. Nested (jagged) tensors are another layout with their own kernels, not the
# packed or paged tensors these cases time.
LAYOUT_REASONS = {
    Layout.VARLEN: "SDPA has no varlen API (packed sequences with cu_seqlens); nested "
                   "tensors are not the packed layout these cases time",
    Layout.PAGED: "SDPA has no paged KV cache API (K/V pages behind a block table)",
}


def window_mask(case: Case, inputs: Inputs) -> torch.Tensor:
    """(B|1, 1, Nq, Nk) boolean visibility of a dense case with a sliding window: the band
    of harness.core.serving (causal limit and alignment included), and-ed with the case's
    key padding or random mask."""
    from harness.core.serving import seq_visibility

    vis = seq_visibility(case, case.seqlen_q, case.seqlen_k)[None, None].to(inputs.q.device)
    if inputs.mask is not None:
        vis = vis & inputs.mask.to(device=inputs.q.device, dtype=torch.bool)
    return vis


_BACKEND_WORDS = {"flash": "flash", "efficient": "memory efficient", "cudnn": "cudnn",
                  "math": "math"}


def _refusal_reason(err: BaseException, caught: list, backend: str = "") -> str:
    """The backend's own reason: torch warns one line per failed requirement (after a
    "<backend> kernel not used because:" header); keep the lines about this backend."""
    lines = []
    for w in caught:
        if not issubclass(w.category, UserWarning):
            continue
        text = str(w.message).split("(Triggered internally", 1)[0].strip()
        for line in text.splitlines():
            line = line.strip()
            if line and not line.endswith("because:"):
                lines.append(line)
    word = _BACKEND_WORDS.get(backend, "")
    own = [x for x in lines if word and word in x.lower()]
    why = own or lines
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return "; ".join(dict.fromkeys(why[:3])) if why else text


@dataclass
class SdpaPeer(Candidate):
    backend: str = "math"
    _support_cache: dict = field(default_factory=dict, repr=False)
    _bwd_support_cache: dict = field(default_factory=dict, repr=False)

    # -------------------------------------------------------------- building the call

    def _call(self, case: Case, inputs: Inputs, *, gqa_native: bool = True
              ) -> Callable[[], torch.Tensor]:
        """A zero-argument call computing the output (B, H, Nq, d) for these inputs: the
        mask, expanded K/V and backend context are prepared here, outside the timed call."""
        q, k, v = inputs.q, inputs.k, inputs.v
        gqa = case.kv_heads != case.heads
        scale = 1.0 / math.sqrt(case.head_dim)
        square = case.seqlen_q == case.seqlen_k
        if gqa and not gqa_native:
            k = k.repeat_interleave(case.group_size, dim=1)
            v = v.repeat_interleave(case.group_size, dim=1)
            gqa = False

        if case.alibi:  # a float attn_mask, mask and window in it as -inf (peer_mods)
            return self._sdpa(q, k, v, alibi_mask(case, inputs), False, scale, gqa)

        if case.has_window:
            # The window (with the causal limit in it) as a boolean attn_mask: taken by
            # the backends that accept an arbitrary mask, refused by the others.
            return self._sdpa(q, k, v, window_mask(case, inputs), False, scale, gqa)

        if case.mask is MaskKind.CAUSAL_BR and not square and self.backend == "flash":
            # aten flash: is_causal means bottom-right (FlashAttention's convention). Head
            # dims padded to a multiple of 8 (V's on its own: d_v may differ from d_qk).
            def pad8(t: torch.Tensor) -> torch.Tensor:
                pad = (-t.shape[-1]) % 8
                return torch.nn.functional.pad(t, (0, pad)) if pad else t

            qp, kp, vp = pad8(q), pad8(k), pad8(v)
            dv = case.dv

            def flash_br() -> torch.Tensor:
                out = torch.ops.aten._scaled_dot_product_flash_attention(
                    qp, kp, vp, 0.0, is_causal=True, return_debug_mask=False, scale=scale)[0]
                return out[..., :dv]

            return flash_br

        if case.mask is MaskKind.CAUSAL_BR and not square and self.backend == "efficient":
            from torch.nn.attention.bias import CausalVariant

            if gqa:  # the aten op has no GQA: give it one K/V head per query head
                k = k.repeat_interleave(case.group_size, dim=1)
                v = v.repeat_interleave(case.group_size, dim=1)
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            mask_type = int(CausalVariant.LOWER_RIGHT)

            def eff_br() -> torch.Tensor:
                out = torch.ops.aten._efficient_attention_forward(
                    qt, kt, vt, bias=None, cu_seqlens_q=None, cu_seqlens_k=None,
                    max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0,
                    custom_mask_type=mask_type, compute_log_sumexp=False, scale=scale,
                    seqlen_k=None)[0]
                return out.transpose(1, 2)

            return eff_br

        attn_mask = None
        is_causal = False
        if case.mask is MaskKind.CAUSAL_TL or (case.mask is MaskKind.CAUSAL_BR and square):
            is_causal = True
        elif case.mask is MaskKind.CAUSAL_BR:
            from torch.nn.attention.bias import causal_lower_right

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "will produce NaNs when Nq > Nk": checked
                attn_mask = causal_lower_right(case.seqlen_q, case.seqlen_k)._materialize(
                    q.device)
        elif inputs.mask is not None:
            attn_mask = inputs.mask.to(device=q.device, dtype=torch.bool)
        return self._sdpa(q, k, v, attn_mask, is_causal, scale, gqa)

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              attn_mask: torch.Tensor | None, is_causal: bool, scale: float, gqa: bool
              ) -> Callable[[], torch.Tensor]:
        """The plain SDPA call under this peer's forced backend."""
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel

        backend = _backend(self.backend)
        kwargs = {"enable_gqa": True} if gqa else {}

        def call() -> torch.Tensor:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                      is_causal=is_causal, scale=scale,
                                                      **kwargs)

        return call

    def _try(self, case: Case, inputs: Inputs, gqa_native: bool) -> str | None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = self._call(case, inputs, gqa_native=gqa_native)()
                if out.is_cuda:
                    torch.cuda.synchronize()
            except Exception as e:  # any refusal by trying: the reason is the backend's
                from harness.core.faults import is_cuda_fatal

                if is_cuda_fatal(str(e)):
                    raise
                return _refusal_reason(e, caught, self.backend)
        return None

    def _probe(self, case: Case) -> tuple[str | None, bool]:
        """(reason it is refused or None, whether native GQA works), decided by running a
        batch-1 copy of the case on this peer's device."""
        key = _signature(case, self.device)
        if key in self._support_cache:
            return self._support_cache[key]
        probe_case = _probe_case(case)
        inputs = make_inputs(probe_case, self.device)
        reason = self._try(probe_case, inputs, gqa_native=True)
        native = reason is None
        # a backend that refuses enable_gqa may still take repeated K/V heads
        if (reason is not None and case.kv_heads != case.heads
                and self._try(probe_case, inputs, gqa_native=False) is None):
            reason = None
        if reason is not None:
            how = ("ALiBi as a float attn_mask: " if case.alibi else
                   "sliding window as a boolean attn_mask: " if case.has_window else "")
            reason = f"{self.name}: {how}{reason}"
        self._support_cache[key] = (reason, native)
        return reason, native

    # -------------------------------------------------------------- Candidate interface

    def supports(self, case: Case) -> str | None:
        if case.layout in LAYOUT_REASONS:
            return f"{self.name}: {LAYOUT_REASONS[case.layout]}"
        why = mod_reason(case)  # softcap and sinks: what SDPA cannot express
        if why:
            return f"{self.name}: {why}"
        static = self.support.reason_unsupported(case)
        if static:
            return static
        if self.device == "cuda" and not torch.cuda.is_available():
            return f"{self.name} needs a CUDA GPU"
        if self.backend == "math":
            score = case.batch * case.heads * case.seqlen_q * case.seqlen_k * 4
            if score > MATH_SCORE_LIMIT_BYTES:
                return (f"math backend materialises a {score / 2**30:.1f} GiB score matrix "
                        f"(limit {MATH_SCORE_LIMIT_BYTES / 2**30:.0f} GiB)")
        return self._probe(case)[0]

    def timed_call(self, case: Case, inputs: Inputs, out: torch.Tensor,
                   lse: torch.Tensor | None) -> Callable[[], object]:
        """The call the timing method measures: the attention alone, no copy into `out`."""
        reason, native = self._probe(case)
        if reason:
            raise BackendRefused(reason)
        return self._call(case, inputs, gqa_native=native)

    def run(self, case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None
            ) -> None:
        result = self.timed_call(case, inputs, out, lse)()
        out.copy_(result)

    # -------------------------------------------------------------- the backward

    def backward_timed_call(self, case: Case, inputs: GradInputs | Inputs,
                            dout: torch.Tensor | None = None) -> Callable[[], tuple]:
        """The forward through autograd here; the call returns (dq, dk, dv) for dO."""
        reason, native = self._probe(case)
        if reason:
            raise BackendRefused(reason)
        dout = dout if dout is not None else inputs.dout  # type: ignore[union-attr]
        leaves = tuple(t.detach().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
        with torch.enable_grad():
            out = self._call(case, Inputs(*leaves, inputs.mask, inputs.key_lengths, inputs.serving),
                             gqa_native=native)()
        return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)

    def supports_backward(self, case: Case) -> str | None:
        key = _signature(case, self.device)
        if key not in self._bwd_support_cache:
            probe = _probe_case(case)
            inputs = make_inputs(probe, self.device)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    grads = self.backward_timed_call(probe, inputs,
                                                     make_grad_output(probe, self.device))()
                    if grads[0].is_cuda:
                        torch.cuda.synchronize()
                    reason = None
                except Exception as e:  # a refusal by trying, as for the forward
                    from harness.core.faults import is_cuda_fatal

                    if is_cuda_fatal(str(e)):
                        raise
                    reason = f"{self.name} backward: {_refusal_reason(e, caught, self.backend)}"
            self._bwd_support_cache[key] = reason
        return self._bwd_support_cache[key]

    def run_backward(self, case: Case, inputs: GradInputs, dq: torch.Tensor,
                     dk: torch.Tensor, dv: torch.Tensor) -> None:
        for buf, got in zip((dq, dk, dv), self.backward_timed_call(case, inputs)(),
                            strict=True):
            buf.copy_(got)


def _peer(backend: str, device: str, description: str, algorithm: str,
          tiles: dict[str, int] | None = None) -> SdpaPeer:
    return SdpaPeer(
        name=f"sdpa_{backend}",
        kind="peer",
        device=device,  # type: ignore[arg-type]
        algorithm=algorithm,
        # window: every backend is offered the window as a mask; one that refuses a mask
        # says so when its support is probed (sdpa_flash takes none).
        # alibi, head_dim_v: every backend is offered ALiBi as a float mask and V of its
        # own head dim; one that refuses either says so when probed (peer_mods).
        support=Support(writes_lse=False, deterministic=backend != "efficient",
                        backward=True, backward_deterministic=backend == "math",
                        window=True, alibi=True, head_dim_v=True),
        description=description,
        isolate=False,
        tiles=dict(tiles or {}),
        backend=backend,
        # Its source is torch's: the backend and the torch build (the noise model pairs
        # runs at one source hash).
        meta={"backend": backend, "torch": torch.__version__,
              "source_hash": hashlib.sha256(
                  f"sdpa:{backend}:{torch.__version__}".encode()).hexdigest()[:16]},
    )


def sdpa_peers() -> list[Candidate]:
    """The four SDPA backends. sdpa_math runs on the CPU when there is no GPU, so CPU CI
    exercises a peer end to end; the others stay "cuda" and skip without one."""
    gpu = torch.cuda.is_available()
    return [
        # Tiles are those of the kernels torch ships (FA2: 128 query rows per block on
        # sm80+; cutlass mem-efficient: 64), used only by the IO model's byte estimate.
        _peer("flash", "cuda", "PyTorch SDPA, FlashAttention-2 backend", "fa2",
              {"block_q": 128}),
        _peer("cudnn", "cuda", "PyTorch SDPA, cuDNN fused attention backend", "ideal"),
        _peer("efficient", "cuda", "PyTorch SDPA, memory-efficient (xformers) backend", "fa2",
              {"block_q": 64}),
        _peer("math", "cuda" if gpu else "cpu",
              "PyTorch SDPA, math backend (materialises the scores)", "naive_fused"),
    ]
