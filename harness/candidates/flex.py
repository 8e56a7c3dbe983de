"""PyTorch's `flex_attention` as a peer, through the Python candidate protocol
(harness.candidates.python_candidate), registered by the project's own entry point in
`fa_harness.candidates`.

Unlike SDPA it takes every mask kind of the grids, as a `mask_mod` turned into a block
mask: both causal alignments, per-batch key padding and an arbitrary boolean mask. It
returns the LSE (natural log; -inf for a fully masked row, whose output is 0).

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


def _mask_mod(mask_kind: str, mask: torch.Tensor | None, key_lengths: torch.Tensor | None,
              causal_offset: int, device: torch.device | str = "cpu"):
    if mask_kind in ("causal_br", "causal_tl"):
        # A captured tensor, not a Python int: dynamo guards on a closure's int, so every
        # new Nk - Nq of the grid would compile the kernel again.
        off = torch.tensor(causal_offset, dtype=torch.int64, device=device)

        def causal(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + off

        return causal
    if mask_kind == "key_padding":
        assert key_lengths is not None
        lengths = key_lengths.to(torch.int64)

        def padding(b, h, q_idx, kv_idx):
            return kv_idx < lengths[b]

        return padding
    if mask_kind == "random":
        assert mask is not None
        dense = mask[:, 0]  # (B|1, Nq, Nk)
        per_batch = dense.shape[0] != 1

        def random(b, h, q_idx, kv_idx):
            return dense[b if per_batch else 0, q_idx, kv_idx]

        return random
    return None


def flex_prepare(q, k, v, *, mask_kind, mask, key_lengths, causal_offset, scale):
    """The block mask is built here, once per input set, outside the timed call."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, H, Nq, _ = q.shape
    Nk = k.shape[2]
    mod = _mask_mod(mask_kind, mask, key_lengths, causal_offset, q.device)
    block_mask = (None if mod is None else
                  create_block_mask(mod, B, None, Nq, Nk, device=q.device))
    flex = _flex(q.device.type)
    gqa = k.shape[1] != H
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # torch before AuxRequest
        AuxRequest = None

    def attempt(fn, kernel_options):
        with warnings.catch_warnings():
            # The CPU path warns that it is not compiled; older keywords are deprecated.
            warnings.simplefilter("ignore")
            extra = {} if kernel_options is None else {"kernel_options": kernel_options}
            if AuxRequest is not None:
                out, aux = fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                              return_aux=AuxRequest(lse=True), **extra)
                return out, aux.lse
            return fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                      return_lse=True, **extra)

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
    key = (q.dtype, tuple(q.shape), tuple(k.shape), mask_kind)
    return lambda: first_working(key, paths, attempt, _note_fallback)


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
                    "every mask kind as a block mask",
        available=_available, prepare=flex_prepare, notes=take_notes,
        # its own (compiled) backward kernel, through autograd; torch has no flex
        # backward on the CPU ("FlexAttention does not support backward on CPU")
        backward_prepare=autograd_backward(flex_attention_fn) if device == "cuda" else None)]
