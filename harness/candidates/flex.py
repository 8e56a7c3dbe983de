"""PyTorch's `flex_attention` as a peer, through the Python candidate protocol
(harness.candidates.python_candidate), registered by the project's own entry point in
`fa_harness.candidates`.

Unlike SDPA it takes every mask kind of the grids, as a `mask_mod` turned into a block
mask (harness.candidates.flex_masks): both causal alignments, per-batch key padding, an
arbitrary boolean mask, sliding windows of either alignment, and the varlen layout as
flex's own document masking over the packed tensors. It returns the LSE (natural log;
-inf for a fully masked row, whose output is 0). Paged caches are skipped: torch's
public API has no paged flex_attention (PAGED_REASON).

Score modifiers (harness.candidates.flex_mods): softcap and ALiBi are a `score_mod`;
sinks, which no score_mod can add, are folded in from the LSE after the kernel. Any head
dim, and d_v != d_qk (flex's `Ev`; compiled, non-power-of-two dims are padded inside
the kernel). FP8 cases are skipped (FP8_REASON).

Varlen padding rows. flex_attention writes every row of its output, and the harness's
padding rows between packed sequences must stay unwritten. So flex never writes the
harness's buffers: when a case has padding rows, the timed call gathers the sequences'
query rows (index_select by row), runs flex on them back to back under a compact document
mask, and scatters its output and LSE rows (index_copy_) into a scratch result of q's
shape made in the preparation; the harness copies only the sequences' rows of that into
its buffers (harness.candidates.python_candidate). The gather and scatter are timed: they
are what it takes to run flex on this layout. Running flex on the padded rows instead
would also be correct, but slower than any user would run it: on the H200 (torch 2.11)
a varlen decode batch of 8 caches up to 8k keys (7 single-row queries, 22 packed rows
with the padding) took 7.3 ms on the padded rows and 0.24 ms compacted, gather and
scatter included (flex's decoding kernel is far slower at 4 x 22 grouped query rows than
at 4 x 7).

On a GPU it runs compiled (`torch.compile(flex_attention)`: the fused Triton kernel that
is worth comparing with); on the CPU it runs torch's eager implementation, which
materialises the scores but computes the same function, so CPU CI exercises the
protocol end to end. Recompiles per shape are expected (the grids vary every size), so
the child process running it raises dynamo's recompile limit, and sizes that change
become dynamic after the first recompile.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from harness.candidates.flex_masks import block_mask_for
from harness.candidates.flex_mods import score_mod_for, with_sinks
from harness.candidates.python_candidate import PythonKernel, autograd_backward

_compiled: dict[str, Any] = {}
# The path (compiled, compiled with small tiles, eager) that worked for a shape, so every
# later call of that shape, timed ones included, goes straight to it.
_chosen: dict[tuple, int] = {}


def _flex(device: str):
    from torch.nn.attention.flex_attention import flex_attention

    if device != "cuda":
        return flex_attention
    if "cuda" not in _compiled:
        import torch._dynamo

        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 256)
        # The backward is timed again and again on one graph (autograd_backward keeps it):
        # a compiled backward with donated buffers refuses retain_graph=True, so buffers
        # are not donated (the setting torch's own error message names).
        import torch._functorch.config as functorch_config

        if hasattr(functorch_config, "donated_buffer"):
            functorch_config.donated_buffer = False
        # dynamic=None: after the first recompile torch marks the changing sizes dynamic,
        # so the grids' many shapes share a few compiled kernels.
        _compiled["cuda"] = torch.compile(flex_attention)
    return _compiled["cuda"]


def flex_prepare(q, k, v, *, mask_kind, mask, key_lengths, causal_offset, scale,
                 window_left=-1, window_right=-1, layout="dense", serving=None,
                 softcap=0.0, alibi_slopes=None, sinks=None, **_):
    """The block mask and the score_mod are built here, once per input set (and the
    block mask kept while the next input set of the same case needs the same one:
    flex_masks), outside the timed call."""
    H = q.shape[1]
    window = (window_left, window_right)
    rows = _padded_rows(q, serving) if layout == "varlen" else None
    block_mask = block_mask_for(q, k, mask_kind=mask_kind, mask=mask,
                                key_lengths=key_lengths, causal_offset=causal_offset,
                                window=window, layout=layout, serving=serving,
                                compact=rows is not None)
    # softcap and ALiBi as a score_mod; sinks folded in from the LSE (flex_mods' doc)
    score_mod = score_mod_for(softcap, alibi_slopes, mask_kind, q.shape[2], k.shape[2],
                              q.device)
    mod_kw = {} if score_mod is None else {"score_mod": score_mod}
    flex = _flex(q.device.type)
    gqa = k.shape[1] != H
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # torch before AuxRequest
        AuxRequest = None
    if rows is not None:  # the scratch result the sequences' rows are scattered into
        out_s = q.new_zeros(q.shape[:3] + (v.shape[-1],))
        lse_s = torch.full(q.shape[:3], -torch.inf, dtype=torch.float32, device=q.device)

    def flex_call(fn, kernel_options):
        with warnings.catch_warnings():
            # The CPU path warns that it is not compiled; older keywords are deprecated.
            warnings.simplefilter("ignore")
            extra = {} if kernel_options is None else {"kernel_options": kernel_options}
            q_in = q if rows is None else q.index_select(2, rows)
            if AuxRequest is not None:
                out, aux = fn(q_in, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                              return_aux=AuxRequest(lse=True), **mod_kw, **extra)
                return with_sinks(out, aux.lse, sinks)
            out, lse = fn(q_in, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                          return_lse=True, **mod_kw, **extra)
            return with_sinks(out, lse, sinks)

    def attempt(fn, kernel_options):
        out, lse = flex_call(fn, kernel_options)
        if rows is None:
            return out, lse
        return out_s.index_copy_(2, rows, out), lse_s.index_copy_(2, rows, lse.float())

    if q.device.type != "cuda":
        return lambda: attempt(flex, None)
    # For some shapes Inductor builds no kernel at its default tile (seen on the H200:
    # NoValidChoicesError on random and key-padding cases of the full grid). The peer then
    # runs as a user of flex_attention would make it run: smaller tiles, else torch's
    # eager flex_attention (same function, scores materialised). The path is chosen at
    # the first call of a shape and kept, so a timed call never retries; a CUDA error is
    # never caught here (the context is gone: it is the case's verdict).
    from torch.nn.attention.flex_attention import flex_attention as eager

    paths = [(flex, None), (flex, _SMALL_TILES), (eager, None)]
    key = (q.dtype, tuple(q.shape), tuple(k.shape), tuple(v.shape), mask_kind, window,
           layout, bool(softcap), alibi_slopes is not None)
    return lambda: first_working(key, paths, attempt, _note_fallback)


def _padded_rows(q: torch.Tensor, serving: Any) -> torch.Tensor | None:
    """A varlen case's query rows that belong to a sequence (int64, on q's device), or
    None when there is no padding between them (flex then runs on q as it is)."""
    from harness.candidates.flex_masks import placement_of, sequence_rows

    rows = sequence_rows(placement_of(serving))
    if rows == list(range(q.shape[2])):
        return None
    return torch.tensor(rows, dtype=torch.int64, device=q.device)


def first_working(key: tuple, paths: list[tuple[Any, Any]], attempt: Any,
                  on_fallback: Any) -> Any:
    """`attempt(*path)` for the path remembered for `key`, else for each path in turn
    until one does not fail to compile (remembered from then on). Any other error, or a
    compile failure of the last path, propagates."""
    if key in _chosen:
        return attempt(*paths[_chosen[key]])
    for n, path in enumerate(paths):
        try:
            result = attempt(*path)
        except Exception as e:  # noqa: BLE001 - only compile failures are retried
            if n == len(paths) - 1 or not _compile_failure(e):
                raise
            on_fallback(e, paths[n + 1])
            continue
        _chosen[key] = n
        return result
    raise AssertionError("unreachable")


# Tiles small enough for any head dim up to 256 in the shared memory of an sm_80+ GPU.
_SMALL_TILES = {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1, "num_warps": 4}


def _compile_failure(e: BaseException) -> bool:
    """An Inductor/Triton failure to build a kernel (not a CUDA runtime error)."""
    from harness.core.faults import is_cuda_fatal

    if is_cuda_fatal(str(e)):
        return False
    mod = type(e).__module__ or ""
    return mod.startswith(("torch._inductor", "torch._dynamo", "triton")) or \
        "NoValidChoicesError" in str(e)


# Fallbacks taken since the harness last asked (PythonKernel.notes): kept with the result.
_notes: list[str] = []


def _note_fallback(e: BaseException, nxt: tuple) -> None:
    # the case (shape, mask, dtype) is in the result the note is kept with
    how = "tiles 32x32" if nxt[1] else "torch's eager flex_attention"
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
    _notes.append(f"compiled kernel failed ({type(e).__name__}: {first}); ran {how}")


def take_notes() -> list[str]:
    out = list(_notes)
    _notes.clear()
    return out


def flex_attention_fn(q, k, v, **kw):
    return flex_prepare(q, k, v, **kw)()


# torch's flex_attention reads K/V through a block mask over dense (or packed) tensors;
# paging exists only as torch.nn.attention.experimental._paged_attention, a private
# module (its own page layout and a converted block mask), not a public API to time.
PAGED_REASON = ("flex_attention cannot read a block table: torch's public API has no paged "
                "KV cache (only the private torch.nn.attention.experimental._paged_attention)")


# flex_attention takes e4m3 tensors on the GPU but no descales: the harness's scales would
# have to go through a score_mod (d_q d_k) and a rescale of O (d_v), a peer not written.
FP8_REASON = ("flex_attention has no descale arguments for e4m3 inputs (an FP8 flex peer, "
              "descales through a score_mod and a rescale of O, is not written)")


def flex_supports(case) -> str | None:  # noqa: ANN001 - a harness.core.cases.Case
    if case.layout.value == "paged":
        return PAGED_REASON
    return FP8_REASON if case.fp8.value != "none" else None


def _available() -> str | None:
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no flex_attention"
    return None


def flex_candidates() -> list[PythonKernel]:
    """flex_attention on the GPU when there is one, else on the CPU (eager)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return [PythonKernel(
        name="flex_attention", fn=flex_attention_fn, device=device,
        dtypes=("float16", "bfloat16"), head_dims=None, gqa=True, lse="-inf",
        deterministic=True, algorithm="fa2" if device == "cuda" else "naive_fused",
        tiles={"block_q": 128} if device == "cuda" else {},
        description="PyTorch flex_attention (compiled on the GPU, eager on the CPU), "
                    "every mask kind, sliding windows and varlen as a block mask, softcap "
                    "and ALiBi as a score_mod, sinks from the LSE",
        available=_available, prepare=flex_prepare, notes=take_notes,
        supports=flex_supports, layouts=("dense", "varlen"), window=True,
        # softcap and ALiBi as a score_mod, sinks from the LSE (flex_mods); V's own head
        # dim is flex's Ev
        softcap=True, alibi=True, sinks=True, head_dim_v=True,
        # its own (compiled) backward kernel, through autograd; torch has no flex
        # backward on the CPU ("FlexAttention does not support backward on CPU"); the
        # forward it differentiates builds the window's block mask, so it has the window
        backward_prepare=autograd_backward(flex_attention_fn) if device == "cuda" else None,
        backward_window=device == "cuda")]
