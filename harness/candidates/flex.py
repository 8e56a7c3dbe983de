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

from harness.candidates.python_candidate import PythonKernel

_compiled: dict[str, Any] = {}


def _flex(device: str):
    from torch.nn.attention.flex_attention import flex_attention

    if device != "cuda":
        return flex_attention
    if "cuda" not in _compiled:
        import torch._dynamo

        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 256)
        # dynamic=None: after the first recompile torch marks the changing sizes dynamic,
        # so the grids' many shapes share a few compiled kernels.
        _compiled["cuda"] = torch.compile(flex_attention)
    return _compiled["cuda"]


def _mask_mod(mask_kind: str, mask: torch.Tensor | None, key_lengths: torch.Tensor | None,
              causal_offset: int):
    if mask_kind in ("causal_br", "causal_tl"):
        off = causal_offset

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
    mod = _mask_mod(mask_kind, mask, key_lengths, causal_offset)
    block_mask = (None if mod is None else
                  create_block_mask(mod, B, None, Nq, Nk, device=q.device))
    flex = _flex(q.device.type)
    gqa = k.shape[1] != H
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # torch before AuxRequest
        AuxRequest = None

    def call():
        with warnings.catch_warnings():
            # The CPU path warns that it is not compiled; older keywords are deprecated.
            warnings.simplefilter("ignore")
            if AuxRequest is not None:
                out, aux = flex(q, k, v, block_mask=block_mask, scale=scale,
                                enable_gqa=gqa, return_aux=AuxRequest(lse=True))
                return out, aux.lse
            return flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                        return_lse=True)

    return call


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
        available=_available, prepare=flex_prepare)]
