"""Python candidates: any Python-callable attention (a Triton kernel, a torch extension,
`flash_attn_func`, `flex_attention`) judged like every other candidate.

The protocol (docs/python-candidates.md has a worked example):

    from harness.candidates.python_candidate import PythonKernel

    def my_attention(q, k, v, *, mask_kind, mask, key_lengths, causal_offset, scale):
        ...
        return out            # or (out, lse) when the declaration says lse="-inf"/"+inf"

    candidate = PythonKernel(name="my_attn", fn=my_attention, device="cuda",
                             dtypes=("float16",), head_dims=(64, 128),
                             masks=("none", "causal_br", "causal_tl"), gqa=True,
                             lse="-inf", deterministic=True)

Arguments: q (B, H, Nq, d), k and v (B, Hkv, Nk, d) in the case dtype on `device`
(H a multiple of Hkv: grouped-query attention); `mask_kind` one of none, causal_br
(bottom-right aligned: key j is visible to query i iff j <= i + causal_offset), causal_tl
(top-left: causal_offset is 0), key_padding, random; `mask` a boolean tensor
broadcastable to (B, 1, Nq, Nk), True = visible, for key_padding and random (else None);
`key_lengths` int32 (B,) valid keys per batch entry for key_padding (else None); `scale`
the softmax scale (1/sqrt(d)). It returns out (B, H, Nq, d) in the case dtype on the
same device, and with `lse` declared, (out, lse) with lse (B, H, Nq) float32, natural log,
for a fully masked row out = 0 and lse = the declared value. An optional `prepare`
with the same arguments returns a call of no arguments (work done in `prepare`, such as
building a block mask, stays outside the timed call).

Serving shapes (harness.core.serving: its doc is the semantics). A kernel declaring
`layouts=("dense", "varlen", ...)` or `window=True` gets six more keywords: `window_left`
and `window_right` (-1: unbounded; aligned like the causal mask, top-left under causal_tl,
else bottom-right per sequence), `layout` ("dense", "varlen", "paged"), `serving` (the
case's harness.core.serving.ServingIndex of int32 tensors on `device`, None for dense),
`max_seqlen_q` and `max_seqlen_k` (the case's largest lengths). Varlen: q, k, v and the
result are packed (1, H, Tq, d) / (1, Hkv, Tk, d); the harness copies only the sequences'
rows of the result into its buffers (their padding rows must stay unwritten, and the
result is the kernel's own memory). Paged: k and v are page pools. The backward of a
serving layout is not part of the protocol (skipped with the reason); a dense
windowed case's backward runs for a kernel declaring `backward_window=True` only.

Score modifiers (harness.core.reference's doc: softcap, ALiBi, sinks). A kernel declaring
`softcap=True`, `alibi=True` or `sinks=True` gets, in its forward, the keyword `softcap`
(the cap, 0.0 for none), `alibi_slopes` or `sinks` (float32 (H,) on `device`, None when
the case has none) respectively; a kernel declaring none is called as before, and cases
needing a modifier it does not declare are skipped with the reason. The backward of a
modified case is not checked yet (skipped with the reason). A kernel declaring
`head_dim_v=True` also runs cases whose V head dim d_v differs from d_qk: v and out are
then (..., d_v) wide (the scale stays 1/sqrt(d_qk)). FP8 (harness.core.fp8): a kernel
declaring `fp8=True` (e4m3 q, k, v) or `fp8_kv=True` (an e4m3 KV cache, q in the dtype)
gets the keywords `q_descale`, `k_descale`, `v_descale` (float32, None where a tensor is
not e4m3) and `out_dtype` (the case dtype, torch's); its out is in that dtype. The backward of fp8 cases is not checked.

It is registered by an entry point in the group `fa_harness.candidates` (its value
names a `PythonKernel`, a list of them, or a function of no arguments returning either)
or named on the command line as `--candidate module:attr`. The harness copies the
returned tensors into its poisoned, guarded output buffers, so the same buffer checks,
tolerance rule, timing method, records and gate apply; the candidate runs in an isolated
child process, so a crash or a hang is a verdict. A result of the wrong type, shape,
dtype or device is the case's `error` verdict, naming what was expected.

A backward is declared with `backward` (and optionally `backward_prepare`, the same
split as `prepare`):

    def my_attention_bwd(q, k, v, out, lse, dout, *, mask_kind, mask, key_lengths,
                         causal_offset, scale):
        return dq, dk, dv     # dq like q; dk, dv like k and v (GQA: summed per K/V head)

    candidate = PythonKernel(..., backward=my_attention_bwd,
                             backward_deterministic=False)   # dQ by atomics

`out` and `lse` are the forward's (the harness gives the oracle's, rounded to the case
dtype, and the LSE in the declared convention), `dout` the output gradient; none of them
may be modified. `backward_masks=("none", "causal_br")` declares the mask kinds the backward runs (among
`masks`; default: all of them), `backward_head_dims=(64, 128)` its head dims (among
`head_dims`): the backward of another case is skipped with the reason wherever backward
cases are chosen. `autograd_backward(fn)` builds a `backward_prepare` from the forward `fn`
through torch.autograd (the forward runs in the prepare, the timed call is the backward
alone): how the shipped flex_attention and the SDPA peers get theirs.

This is trusted code: it runs in the CI of the team that wrote it. Submissions, which
are not trusted, stay CUDA source only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from harness.candidates.python_kwargs import mod_args
from harness.candidates.python_output import CandidateOutputError, expect_tensor, sequence_rows
from harness.candidates.python_source import source_hash
from harness.core.candidate import Candidate, Support
from harness.core.cases import DTYPES, Case, GradInputs, Inputs, Layout, MaskKind


@dataclass(frozen=True)
class PythonKernel:
    """A Python candidate's declaration: the callable and what it supports."""

    name: str
    fn: Callable[..., Any]
    device: Literal["cpu", "cuda"] = "cuda"
    dtypes: tuple[str, ...] = ("float16", "bfloat16")
    head_dims: tuple[int, ...] | None = None  # None: any head dim
    masks: tuple[str, ...] = tuple(m.value for m in MaskKind)
    gqa: bool = True
    lse: Literal["-inf", "+inf"] | None = None  # None: returns out only
    deterministic: bool = True
    algorithm: str = "ideal"  # harness.core.iomodel key for the byte estimate
    description: str = ""
    # None when it can run here, else the reason (one line), e.g. "needs triton".
    available: Callable[[], str | None] | None = None
    tiles: dict[str, int] = field(default_factory=dict)
    # Optional: prepare(q, k, v, **same keywords) -> a call of no arguments returning what
    # fn returns. Work done here (building a block mask, a plan) is outside the timed
    # call, as the SDPA peers prepare their masks outside theirs.
    prepare: Callable[..., Callable[[], Any]] | None = None
    # Optional: notes() -> the lines it has to say about its calls since the last notes()
    # (a fallback it took); the harness keeps them with the case's result (extra.notes).
    notes: Callable[[], list[str]] | None = None
    # Optional: the backward (module doc). backward_prepare(q, k, v, out, lse, dout,
    # **keywords) -> a call of no arguments returning (dq, dk, dv); or `backward`, the
    # same returning them directly.
    backward: Callable[..., Any] | None = None
    backward_prepare: Callable[..., Callable[[], Any]] | None = None
    backward_deterministic: bool = False
    # Whether the backward applies a sliding window too (it gets the same window keywords
    # as the forward); without it a windowed case's backward is skipped with the reason.
    backward_window: bool = False
    # The mask kinds the backward runs, among `masks` (None: all of the forward's); the
    # backward of a case under another mask is skipped with the reason.
    backward_masks: tuple[str, ...] | None = None
    # The head dims the backward runs, among `head_dims` (None: the forward's).
    backward_head_dims: tuple[int, ...] | None = None
    # Optional: supports(case) -> None, or the reason the case is skipped. Asked before
    # the declaration's own reasons, so that it can say why (flex_attention: why it reads
    # no paged cache) where the declaration would only say "not supported".
    supports: Callable[[Case], str | None] | None = None
    # Serving shapes (harness.core.serving): the layouts it reads ("dense", "varlen",
    # "paged") and whether it applies a sliding window. A kernel declaring either gets the
    # serving keywords (module doc); the others are called as before.
    layouts: tuple[str, ...] = ("dense",)
    window: bool = False
    # Score modifiers (harness.core.reference's doc; docs/score-mods.md): the forward of
    # a kernel declaring one gets its keyword (softcap: the cap, 0.0 for none;
    # alibi_slopes, sinks: float32 (H,) on `device`, or None), on every case. Cases with
    # a modifier it does not declare are skipped with the reason.
    softcap: bool = False
    alibi: bool = False
    sinks: bool = False
    # Cases whose V head dim d_v differs from d_qk: v is (B, Hkv, Nk, d_v) and so is the
    # result's out (B, H, Nq, d_v); no keyword (the shapes say it).
    head_dim_v: bool = False
    # FP8 inputs (harness.core.fp8; docs/fp8.md): e4m3 q, k, v (fp8) or an e4m3 KV cache
    # (fp8_kv); such a kernel gets q_descale, k_descale, v_descale on every case.
    fp8: bool = False
    fp8_kv: bool = False
    # A peer brought for comparison (an installed library's attention): a yardstick of
    # the gate unless named on its command line, like the SDPA peers.
    yardstick: bool = False

    def problems(self) -> list[str]:
        """What is wrong with the declaration (empty when it is valid)."""
        out = []
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            out.append(f"name {self.name!r} must be letters, digits, '_' or '-'")
        if not callable(self.fn):
            out.append("fn is not callable")
        if self.device not in ("cpu", "cuda"):
            out.append(f"device {self.device!r} is not 'cpu' or 'cuda'")
        bad = [d for d in self.dtypes if d not in DTYPES]
        if bad or not self.dtypes:
            out.append(f"dtypes {list(self.dtypes)} must be among {sorted(DTYPES)}")
        known = {m.value for m in MaskKind}
        if not self.masks or any(m not in known for m in self.masks):
            out.append(f"masks {list(self.masks)} must be among {sorted(known)}")
        if self.lse not in (None, "-inf", "+inf"):
            out.append(f"lse {self.lse!r} must be None, '-inf' or '+inf'")
        if self.head_dims is not None and not all(isinstance(d, int) and d > 0
                                                  for d in self.head_dims):
            out.append("head_dims must be positive integers (or None for any)")
        for what in ("backward", "backward_prepare", "supports"):
            f = getattr(self, what)
            if f is not None and not callable(f):
                out.append(f"{what} is not callable")
        if self.backward is not None and self.backward_prepare is not None:
            out.append("give backward or backward_prepare, not both")
        if self.backward_masks is not None:
            bad_bwd = [m for m in self.backward_masks if m not in self.masks]
            if not self.has_backward:
                out.append("backward_masks given without a backward")
            elif isinstance(self.backward_masks, str) or not self.backward_masks or bad_bwd:
                out.append(f"backward_masks {self.backward_masks!r} must be a non-empty "
                           f"list among the forward's masks {list(self.masks)}")
        if self.backward_head_dims is not None:
            dims = self.backward_head_dims
            if not self.has_backward:
                out.append("backward_head_dims given without a backward")
            elif (isinstance(dims, (str, int)) or not dims
                  or any(not isinstance(d, int) or d <= 0 for d in dims)
                  or (self.head_dims is not None and any(d not in self.head_dims for d in dims))):
                out.append(f"backward_head_dims {dims!r} must be a non-empty list of head "
                           f"dims among the forward's ({self.head_dims or 'any'})")
        known_layouts = {x.value for x in Layout}
        if "dense" not in self.layouts or any(x not in known_layouts for x in self.layouts):
            out.append(f"layouts {list(self.layouts)} must include 'dense' and be among "
                       f"{sorted(known_layouts)}")
        return out

    @property
    def serving(self) -> bool:
        """Whether it takes the serving keywords (a layout beyond dense, or a window)."""
        return self.window or set(self.layouts) != {"dense"}

    @property
    def has_backward(self) -> bool:
        return self.backward is not None or self.backward_prepare is not None


MAX_NOTES, MAX_NOTE_CHARS = 5, 300


@dataclass
class PythonCandidate(Candidate):
    kernel: PythonKernel | None = None
    origin: str = ""

    def unavailable_reason(self) -> str | None:
        if self.kernel is not None and self.kernel.available is not None:
            try:
                reason = self.kernel.available()
            except Exception as e:  # a broken availability probe is a reason, not a crash
                reason = f"availability check raised {type(e).__name__}: {e}"
            if reason:
                return reason
        if self.device == "cuda" and not torch.cuda.is_available():
            return "needs a CUDA GPU (none available here)"
        return None

    def supports(self, case: Case) -> str | None:
        if self.kernel is not None and self.kernel.supports is not None:
            reason = self.kernel.supports(case)
            if reason:
                return reason
        return self.support.reason_unsupported(case)

    def _args(self, case: Case, inputs: Inputs) -> dict[str, Any]:
        kw = {"mask_kind": case.mask.value, "mask": inputs.mask,
              "key_lengths": inputs.key_lengths, "causal_offset": case.causal_offset,
              "scale": case.head_dim ** -0.5}
        if self.kernel is not None and self.kernel.serving:
            kw.update(window_left=case.window_left, window_right=case.window_right,
                      layout=case.layout.value, serving=inputs.serving,
                      max_seqlen_q=case.seqlen_q, max_seqlen_k=case.seqlen_k)
        return kw

    def timed_call(self, case: Case, inputs: Inputs, out: torch.Tensor,
                   lse: torch.Tensor | None) -> Callable[[], object]:
        """The call the timing method measures: the candidate's own call, no copy."""
        assert self.kernel is not None
        fn, q, k, v, kw = self.kernel.fn, inputs.q, inputs.k, inputs.v, self._args(case, inputs)
        kw.update(mod_args(self.kernel, case, inputs))
        if self.kernel.prepare is not None:
            return self.kernel.prepare(q, k, v, **kw)
        return lambda: fn(q, k, v, **kw)

    def run(self, case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None
            ) -> None:
        result = self.timed_call(case, inputs, out, lse)()
        got_out, got_lse = self._split(result)
        expect_tensor(got_out, "out", out)
        if lse is not None:
            expect_tensor(got_lse, "lse", lse)
        # Varlen: only the sequences' rows are copied. The returned tensors are the
        # candidate's own memory, whose padding rows it may well have written (flex_attention
        # writes every row); the harness's padding rows must keep their poison.
        rows = sequence_rows(inputs) if case.layout is Layout.VARLEN else None
        for got, buf in ((got_out, out), (got_lse, lse)):
            if buf is None:
                continue
            if rows is None:
                buf.copy_(got)
            else:
                buf.index_copy_(2, rows, got.index_select(2, rows))

    def supports_backward(self, case: Case) -> str | None:
        # The backward's buffers and oracle are those of the dense (B, H, N, d) layout.
        if case.is_serving:
            return f"the backward of the {case.layout.value} layout is not part of the protocol"
        if case.has_window and not (self.kernel is not None and self.kernel.backward_window):
            return "its backward applies no sliding window (backward_window=False)"
        return None

    def backward_timed_call(self, case: Case, inputs: GradInputs) -> Callable[[], Any]:
        """The backward call the timing method measures (its preparation done here)."""
        k_ = self.kernel
        if k_ is None or not k_.has_backward:
            raise NotImplementedError(f"{self.name} declares no backward")
        args = (inputs.q, inputs.k, inputs.v, inputs.out, inputs.lse, inputs.dout)
        kw = self._args(case, inputs)
        if k_.backward_prepare is not None:
            return k_.backward_prepare(*args, **kw)
        return lambda: k_.backward(*args, **kw)

    def run_backward(self, case: Case, inputs: GradInputs, dq: torch.Tensor,
                     dk: torch.Tensor, dv: torch.Tensor) -> None:
        result = self.backward_timed_call(case, inputs)()
        if not (isinstance(result, tuple | list) and len(result) == 3):
            raise CandidateOutputError(f"backward returned {type(result).__name__}, "
                                       f"expected (dq, dk, dv)")
        for name, got, buf in zip(("dq", "dk", "dv"), result, (dq, dk, dv), strict=True):
            expect_tensor(got, name, buf)
            buf.copy_(got)

    def take_notes(self) -> list[str]:
        if self.kernel is None or self.kernel.notes is None:
            return []
        try:
            lines = [str(x) for x in self.kernel.notes() or []]
        except Exception as e:  # noqa: BLE001 - a broken notes() is itself a note
            lines = [f"notes() raised {type(e).__name__}: {e}"]
        # kept in every record of the case: a few short lines
        return [x[:MAX_NOTE_CHARS] for x in lines[:MAX_NOTES]]

    def _split(self, result: Any) -> tuple[Any, Any]:
        if self.support.writes_lse:
            if not (isinstance(result, tuple | list) and len(result) == 2):
                raise CandidateOutputError(
                    f"returned {type(result).__name__}, expected (out, lse): the candidate "
                    f"declares lse={self.kernel.lse if self.kernel else None!r}")
            return result[0], result[1]
        if isinstance(result, tuple | list):
            raise CandidateOutputError("returned a tuple, expected the out tensor alone "
                                       "(the candidate declares no lse)")
        return result, None


def to_candidate(k: PythonKernel, origin: str) -> PythonCandidate:
    support = Support(dtypes=frozenset(k.dtypes),
                      head_dims=frozenset(k.head_dims) if k.head_dims is not None else None,
                      masks=frozenset(MaskKind(m) for m in k.masks), gqa=k.gqa,
                      writes_lse=k.lse is not None, masked_lse=k.lse or "-inf",
                      deterministic=k.deterministic, backward=k.has_backward,
                      backward_deterministic=k.backward_deterministic,
                      backward_masks=(None if k.backward_masks is None else
                                      frozenset(MaskKind(m) for m in k.backward_masks)),
                      backward_head_dims=(None if k.backward_head_dims is None else
                                          frozenset(k.backward_head_dims)),
                      layouts=frozenset(Layout(x) for x in k.layouts), window=k.window,
                      softcap=k.softcap, alibi=k.alibi, sinks=k.sinks,
                      head_dim_v=k.head_dim_v, fp8=k.fp8, fp8_kv=k.fp8_kv)
    return PythonCandidate(name=k.name, kind="python", device=k.device, algorithm=k.algorithm,
                           support=support, description=k.description, isolate=True,
                           tiles=dict(k.tiles),
                           meta={"origin": origin, "source_hash": source_hash(
                               (k.fn, k.prepare, k.backward, k.backward_prepare),
                               extra=k.name), **({"yardstick": True} if k.yardstick else {})},
                           kernel=k,
                           origin=origin)


def kernels_of(obj: Any, where: str) -> list[PythonKernel]:
    """The PythonKernels an entry point or `module:attr` names (see the module doc). A
    function may return none (an empty list: a peer whose library is not installed); an
    empty list named directly is a mistake."""
    called = False
    if not isinstance(obj, PythonKernel | list | tuple) and callable(obj):
        obj, called = obj(), True
    items = list(obj) if isinstance(obj, list | tuple) else [obj]
    if called and isinstance(obj, list | tuple) and not items:
        return []
    if not items or not all(isinstance(x, PythonKernel) for x in items):
        raise TypeError(f"{where} is not a PythonKernel (nor a list of them, nor a function "
                        f"returning one)")
    for x in items:
        probs = x.problems()
        if probs:
            raise TypeError(f"{where}: candidate {x.name!r}: {'; '.join(probs)}")
    return items


def autograd_backward(fn: Callable[..., Any]) -> Callable[..., Callable[[], Any]]:
    """A `backward_prepare` from a forward `fn` of this protocol: the forward runs once on
    copies of q, k, v that require gradients (in the prepare, outside the timed call), and
    the call returns torch.autograd's (dq, dk, dv) for `dout`, keeping the graph so that
    it can be timed again. A forward returning (out, lse) is differentiated through out."""

    def prepare(q, k, v, out, lse, dout, **kw) -> Callable[[], Any]:  # noqa: ANN001
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        with torch.enable_grad():
            got = fn(*leaves, **kw)
        got_out = got[0] if isinstance(got, tuple | list) else got

        def call() -> tuple[torch.Tensor, ...]:
            return torch.autograd.grad(got_out, leaves, dout, retain_graph=True)

        return call

    return prepare
