"""The project's own Triton FlashAttention-2 forward kernel, a Python candidate
(harness.candidates.python_candidate) registered by the project's entry point in
`fa_harness.candidates`.

One program per (query block, batch x head): Q stays in registers, K/V blocks stream
through with the online softmax (exp2, running max and sum in fp32), the output is
normalised once at the end. Every mask kind of the grids: causal (either alignment,
through `causal_offset`; key blocks past the diagonal are never loaded), key padding
(the per-batch key count bounds the loop), and an arbitrary boolean mask read tile by
tile. GQA maps query head h to key/value head h // group. Any head dim up to 256 (the
tile is the next power of two, the tail masked). A fully masked row writes out = 0 and
LSE = -inf. No atomics: deterministic.

Serving shapes (harness.core.serving; the backward stays dense and windowless):
- a sliding window (window_left / window_right, aligned like the causal mask: top-left
  under causal_tl, else bottom-right, with or without a causal mask) on any mask kind:
  key blocks entirely outside a query block's window, at either end, are never loaded
  (the loop starts at the key block holding the first row's left edge and stops after
  the last row's right edge); the partial ones are masked per element;
- the varlen layout: packed q (1, H, Tq, d), k/v (1, Hkv, Tk, d) with cu_seqlens slot
  starts and seqlens lengths. The grid is (query blocks of the longest sequence, heads,
  sequences); a program past its sequence's end returns at once, the others see their
  own (q_len x k_len) problem with the alignment offset o = k_len - q_len (0 under
  causal_tl) and write only their sequence's rows (the padding rows between sequences
  are left alone). Empty sequences and empty caches (rows fully masked) need nothing
  special.
All of it is constexpr-specialised (VARLEN, WIN_LEFT, WIN_RIGHT), so that the plain
dense kernel stays as fast as it was: on an H200 its SASS has the same instruction
sequence as before these existed.

Needs Triton and a CUDA GPU. With `TRITON_INTERPRET=1` it runs in Triton's interpreter
on the CPU (slow; how the kernel is checked on machines without a GPU; bf16 dots are
done in fp32 there, see DOT_F32). Without
Triton, or on a CPU machine without the interpreter, it reports itself unavailable in
one line.
"""

from __future__ import annotations

import math
from functools import cache

import torch

from harness.candidates.python_candidate import PythonKernel
from harness.candidates.triton_common import MAX_HEAD_DIM, interpret
from harness.candidates.triton_fa2_bwd import triton_fa2_bwd_fn

_interpret = interpret


# Triton compiles one kernel per distinct pattern of its integer arguments (equal to 1,
# divisible by 16), and the grids vary every size: left alone, a full-grid run compiles
# a few hundred kernels. Sizes, offsets and the LSE and mask strides are never
# specialised (they bound loops and masks, where the hint buys nothing). The q/k/v/out
# strides are specialised only when all of them are multiples of 16 (head dims 64, 96,
# 128, ...: the divisibility hints give vectorised loads there, and every case of such a
# head dim has the same pattern); otherwise (head dims like 40 or 59) none is.
_SHAPE_ARGS = ["H", "GROUP", "NQ", "NK", "OFFSET", "WL", "WR", "slb", "slh", "smb",
               "smm"]
_STRIDE_ARGS = ["sqb", "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn",
                "sob", "soh", "som"]


@cache
def _kernel(aligned: bool):
    import triton
    import triton.language as tl

    def fa2_fwd(Q, K, V, Out, Lse, MASK, KLEN, CU_Q, CU_K, SEQ_Q, SEQ_K,
                sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
                slb, slh, smb, smm, smn,
                H, GROUP, NQ, NK, OFFSET, WL, WR, scale_log2,
                HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, PADDING: tl.constexpr,
                DENSE: tl.constexpr, DOT_F32: tl.constexpr, VARLEN: tl.constexpr,
                TOP_LEFT: tl.constexpr, WIN_LEFT: tl.constexpr, WIN_RIGHT: tl.constexpr):
        pid_m = tl.program_id(0)
        if VARLEN:
            # One program per (q block of sequence seq, head): the sequence's slot start
            # and length bound its rows, its keys' start and count its keys. The pointers
            # move to the sequence's head (int64: a packed K/V of a long batch passes 2^31
            # elements), so the code below sees one (NQ x kv_len) problem at b = h = 0.
            seq = tl.program_id(2)
            NQ = tl.load(SEQ_Q + seq)
            if pid_m * BLOCK_M >= NQ:
                return  # past the sequence's end (the grid is sized by the longest)
            kv_len = tl.load(SEQ_K + seq)
            q0 = tl.load(CU_Q + seq).to(tl.int64)
            k0 = tl.load(CU_K + seq).to(tl.int64)
            hq = tl.program_id(1).to(tl.int64)
            hkv = hq // GROUP
            Q += hq * sqh + q0 * sqm
            K += hkv * skh + k0 * skn
            V += hkv * svh + k0 * svn
            Out += hq * soh + q0 * som
            Lse += hq * slh + q0
            # The per-sequence alignment offset o (harness.core.serving).
            OFFSET = 0 if TOP_LEFT else kv_len - NQ
            b = 0
            h = 0
            hk = 0
        else:
            pid_bh = tl.program_id(1)
            b = pid_bh // H
            h = pid_bh % H
            hk = h // GROUP
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_D
        row_ok = offs_m < NQ
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        if not VARLEN:
            kv_len = NK
            if PADDING:
                kv_len = tl.load(KLEN + b)
        hi = kv_len
        if CAUSAL:
            # Keys past the last row's diagonal are invisible to the whole block.
            hi = tl.minimum(hi, tl.maximum((pid_m + 1) * BLOCK_M + OFFSET, 0))
        lo = 0
        if WIN_RIGHT:
            # ... and keys past the last row's right window edge.
            hi = tl.minimum(hi, tl.maximum((pid_m + 1) * BLOCK_M + OFFSET + WR, 0))
        if WIN_LEFT:
            # Keys before the first row's left window edge are invisible to the whole
            # block: the loop starts at the key block holding that edge.
            lo = tl.maximum(pid_m * BLOCK_M + OFFSET - WL, 0) // BLOCK_N * BLOCK_N
        for start_n in range(lo, hi, BLOCK_N):
            cols = start_n + offs_n
            col_ok = cols < kv_len
            kt = tl.load(K + b * skb + hk * skh + cols[None, :] * skn + offs_d[:, None],
                         mask=col_ok[None, :] & d_ok[:, None], other=0.0)
            if DOT_F32:
                s = tl.dot(q.to(tl.float32), kt.to(tl.float32)) * scale_log2
            else:
                s = tl.dot(q, kt) * scale_log2
            valid = col_ok[None, :] & row_ok[:, None]
            if CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None] + OFFSET)
            if WIN_RIGHT:
                valid = valid & (cols[None, :] <= offs_m[:, None] + OFFSET + WR)
            if WIN_LEFT:
                valid = valid & (cols[None, :] >= offs_m[:, None] + OFFSET - WL)
            if DENSE:
                mk = tl.load(MASK + b * smb + offs_m[:, None] * smm + cols[None, :] * smn,
                             mask=row_ok[:, None] & col_ok[None, :], other=0)
                valid = valid & (mk != 0)
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row with nothing visible yet keeps max -inf: subtract 0 instead (p = 0).
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            vb = tl.load(V + b * svb + hk * svh + cols[:, None] * svn + offs_d[None, :],
                         mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            if DOT_F32:
                acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype).to(tl.float32),
                                                    vb.to(tl.float32))
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
            m_i = m_new
        live = l_i > 0.0
        l_safe = tl.where(live, l_i, 1.0)
        out = tl.where(live[:, None], acc / l_safe[:, None], 0.0)
        tl.store(Out + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :],
                 out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        lse = tl.where(live, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        tl.store(Lse + b * slb + h * slh + offs_m, lse, mask=row_ok)

    return triton.jit(fa2_fwd, do_not_specialize=_SHAPE_ARGS + ([] if aligned else
                                                                _STRIDE_ARGS))


def _tiles(block_d: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a head-dim tile."""
    if _interpret():
        return 32, 32, 4, 1
    if block_d <= 64:
        return 128, 64, 4, 3
    if block_d <= 128:
        return 128, 64, 8, 3
    return 64, 32, 8, 2


def triton_fa2_fn(q, k, v, *, mask_kind, mask, key_lengths, causal_offset, scale,
                  window_left=-1, window_right=-1, layout="dense", serving=None,
                  max_seqlen_q=None, max_seqlen_k=None, out=None, lse=None):
    """The forward (the protocol of harness.candidates.python_candidate, its serving
    keywords too). `out` and `lse`, when given, are written in place (varlen: only the
    sequences' rows, the padding rows between them are left alone)."""
    B, H, Nq, d = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    if d > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {d} > {MAX_HEAD_DIM}")
    varlen = layout == "varlen"
    if layout not in ("dense", "varlen"):
        raise ValueError(f"triton_fa2 takes the dense and varlen layouts, not {layout!r}")
    if varlen and (serving is None or serving.cu_seqlens_q is None
                   or serving.cu_seqlens_k is None or B != 1):
        raise ValueError("varlen needs packed q (1, H, Tq, d) and a serving index with "
                         "cu_seqlens_q/cu_seqlens_k")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty_like(q) if out is None else _checked(out, "out", q.shape, q.dtype)
    lse = (torch.empty((B, H, Nq), dtype=torch.float32, device=q.device) if lse is None
           else _checked(lse, "lse", (B, H, Nq), torch.float32))
    block_d = max(16, 1 << (d - 1).bit_length())
    block_m, block_n, warps, stages = _tiles(block_d)
    causal = mask_kind in ("causal_br", "causal_tl")
    dense = mask_kind == "random"
    padding = mask_kind == "key_padding"
    if varlen and (dense or padding):
        raise ValueError(f"mask {mask_kind} does not combine with the varlen layout")
    if dense:
        m = mask.expand(-1, 1, Nq, Nk) if mask.shape[2] == 1 else mask
        m = m.contiguous().view(torch.uint8)
        smb = m.stride(0) if m.shape[0] != 1 else 0
        sm = (smb, m.stride(2), m.stride(3))
    else:
        m, sm = out, (0, 0, 0)  # unused pointer
    klen = key_lengths.to(device=q.device, dtype=torch.int32) if padding else lse
    # A window is aligned like the causal mask (bottom-right unless causal_tl), with or
    # without one; the kernel reads one offset for both. Varlen computes its own per
    # sequence.
    offset = causal_offset if causal else Nk - Nq
    if varlen:
        index = (serving.cu_seqlens_q, serving.cu_seqlens_k, serving.seqlens_q,
                 serving.seqlens_k)
        n_seq = serving.seqlens_q.shape[0]
        rows = max_seqlen_q if max_seqlen_q is not None else int(serving.seqlens_q.max())
        grid = (math.ceil(rows / block_m), H, n_seq)
    else:
        index = (lse,) * 4  # unused pointers
        grid = (math.ceil(Nq / block_m), B * H, 1)
    if 0 in grid:
        return out, lse
    aligned = all(st % 16 == 0 for t in (q, k, v, out) for st in t.stride()[:3])
    _kernel(aligned)[grid](
        q, k, v, out, lse, m, klen, *index,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1), *sm,
        H, H // Hk, Nq, Nk, offset, max(window_left, 0), max(window_right, 0),
        scale * 1.4426950408889634,
        HEAD_D=d, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n,
        CAUSAL=causal, PADDING=padding, DENSE=dense,
        # Triton's CPU interpreter computes bf16 dots wrongly (bits read as another type);
        # there, and only there, the operands go to fp32 (rounded to bf16 first, as on
        # the GPU). The compiled kernel uses the tensor cores' bf16 dot.
        DOT_F32=_interpret() and q.dtype == torch.bfloat16,
        VARLEN=varlen, TOP_LEFT=mask_kind == "causal_tl",
        WIN_LEFT=window_left >= 0, WIN_RIGHT=window_right >= 0,
        num_warps=warps, num_stages=stages)
    return out, lse


def _checked(t: torch.Tensor, what: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A caller's output buffer, as the kernel writes it (rows of unit element stride)."""
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.stride(-1) != 1:
        raise ValueError(f"{what} must be {tuple(shape)} {dtype} with a unit last stride, "
                         f"got {tuple(t.shape)} {t.dtype} strides {t.stride()}")
    return t


def _device() -> str:
    return "cpu" if _interpret() and not torch.cuda.is_available() else "cuda"


def _available() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError:
        return "needs Triton (not installed here)"
    if _device() == "cuda" and not torch.cuda.is_available():
        return "needs a CUDA GPU (or TRITON_INTERPRET=1 for Triton's CPU interpreter)"
    return None


def triton_candidates() -> list[PythonKernel]:
    return [PythonKernel(
        name="triton_fa2", fn=triton_fa2_fn, device=_device(),  # type: ignore[arg-type]
        dtypes=("float16", "bfloat16"), head_dims=None, gqa=True, lse="-inf",
        deterministic=True, algorithm="fa2", tiles={"block_q": 128},
        description="Triton FlashAttention-2 (the project's own), forward and backward, "
                    "every mask kind; the forward also varlen and sliding windows",
        available=_available, backward=triton_fa2_bwd_fn, backward_deterministic=True,
        layouts=("dense", "varlen"), window=True)]
