"""The backward of the project's Triton FlashAttention-2 kernel (harness.candidates.triton_fa2).

The FA2 backward in two kernels, neither with atomics (so it is bitwise deterministic):
- dK, dV: one program per (block of keys, batch x K/V head), the loop order the
  backward needs (outer K/V, inner Q). For each query head of the GQA group and each
  query block it recomputes P^T = exp(scale K Q^T - LSE) from the forward's LSE, then
  dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q. The group's
  contributions are summed in registers, so dK and dV are written once.
- dQ: one program per (query block, batch x head), the forward's loop order:
  dQ = scale sum_j dS K over the key blocks the rows can see.
D = rowsum(dO * O) is computed once beforehand (fp32). Masks as in the forward (causal in
either alignment, key padding, an arbitrary boolean mask read tile by tile); a fully
masked row (LSE = -inf) has P = 0, so its dQ row is 0 and it adds nothing to dK/dV.
Under Triton's CPU interpreter bf16 dots are done in fp32 (see triton_fa2.DOT_F32).
"""

from __future__ import annotations

import math
from functools import cache

import torch

from harness.candidates.triton_common import MAX_HEAD_DIM
from harness.candidates.triton_common import interpret as _interpret

_SHAPE_ARGS = ["H", "HK", "GROUP", "NQ", "NK", "OFFSET", "slb", "slh", "smb", "smm"]
_STRIDE_ARGS = ["sqb", "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn",
                "sdb", "sdh", "sdm", "sgb", "sgh", "sgn", "sxb", "sxh", "sxn"]


@cache
def _kernels(aligned: bool):
    import triton
    import triton.language as tl

    def fa2_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, MASK, KLEN,
                     sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdb, sdh, sdm,
                     sgb, sgh, sgn, sxb, sxh, sxn, slb, slh, smb, smm, smn,
                     H, HK, GROUP, NQ, NK, OFFSET, scale, scale_log2,
                     HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, PADDING: tl.constexpr,
                     DENSE: tl.constexpr, DOT_F32: tl.constexpr):
        # sdb/sdh/sdm: dO's strides (Q's layout); sgb.. dK's, sxb.. dV's.
        pid_n = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // HK
        hk = pid_bh % HK
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_D
        kv_len = NK
        if PADDING:
            kv_len = tl.load(KLEN + b)
        col_ok = offs_n < kv_len
        k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * skn + offs_d[None, :],
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svn + offs_d[None, :],
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        lo = 0
        if CAUSAL:
            # Query i sees key j iff j <= i + OFFSET: rows before n0 - OFFSET see nothing.
            lo = tl.maximum(pid_n * BLOCK_N - OFFSET, 0)
            lo = (lo // BLOCK_M) * BLOCK_M
        lo = tl.where(pid_n * BLOCK_N >= kv_len, NQ, lo)  # no visible key: dK = dV = 0
        for g in range(0, GROUP):
            h = hk * GROUP + g
            for start_m in range(lo, NQ, BLOCK_M):
                offs_m = start_m + tl.arange(0, BLOCK_M)
                row_ok = offs_m < NQ
                io = row_ok[:, None] & d_ok[None, :]
                q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :],
                            mask=io, other=0.0)
                do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sdm + offs_d[None, :],
                             mask=io, other=0.0)
                lse = tl.load(LSE + b * slb + h * slh + offs_m, mask=row_ok,
                              other=float("-inf"))
                # -inf (a fully masked row, or past the end) -> +inf: every P is 0.
                lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
                delta = tl.load(DELTA + (b * H + h) * NQ + offs_m, mask=row_ok, other=0.0)
                if DOT_F32:
                    st = tl.dot(k.to(tl.float32), tl.trans(q.to(tl.float32)))
                else:
                    st = tl.dot(k, tl.trans(q))
                pt = tl.exp2(st * scale_log2 - lse2[None, :])
                valid = col_ok[:, None] & row_ok[None, :]
                if CAUSAL:
                    valid = valid & (offs_n[:, None] <= offs_m[None, :] + OFFSET)
                if DENSE:
                    mk = tl.load(MASK + b * smb + offs_m[None, :] * smm + offs_n[:, None] * smn,
                                 mask=row_ok[None, :] & col_ok[:, None], other=0)
                    valid = valid & (mk != 0)
                pt = tl.where(valid, pt, 0.0)
                if DOT_F32:
                    dv += tl.dot(pt.to(do.dtype).to(tl.float32), do.to(tl.float32))
                    dpt = tl.dot(v.to(tl.float32), tl.trans(do.to(tl.float32)))
                else:
                    dv += tl.dot(pt.to(do.dtype), do)
                    dpt = tl.dot(v, tl.trans(do))
                dst = pt * (dpt - delta[None, :])
                if DOT_F32:
                    dk += tl.dot(dst.to(q.dtype).to(tl.float32), q.to(tl.float32))
                else:
                    dk += tl.dot(dst.to(q.dtype), q)
        out_ok = (offs_n < NK)[:, None] & d_ok[None, :]
        tl.store(DK + b * sgb + hk * sgh + offs_n[:, None] * sgn + offs_d[None, :],
                 (dk * scale).to(DK.dtype.element_ty), mask=out_ok)
        tl.store(DV + b * sxb + hk * sxh + offs_n[:, None] * sxn + offs_d[None, :],
                 dv.to(DV.dtype.element_ty), mask=out_ok)

    def fa2_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, MASK, KLEN,
                   sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdb, sdh, sdm,
                   sgb, sgh, sgn, slb, slh, smb, smm, smn,
                   H, GROUP, NQ, NK, OFFSET, scale, scale_log2,
                   HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, PADDING: tl.constexpr,
                   DENSE: tl.constexpr, DOT_F32: tl.constexpr):
        # sgb/sgh/sgn: dQ's strides.
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        hk = h // GROUP
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_D
        row_ok = offs_m < NQ
        io = row_ok[:, None] & d_ok[None, :]
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :],
                    mask=io, other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sdm + offs_d[None, :],
                     mask=io, other=0.0)
        lse = tl.load(LSE + b * slb + h * slh + offs_m, mask=row_ok, other=float("-inf"))
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        delta = tl.load(DELTA + (b * H + h) * NQ + offs_m, mask=row_ok, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        kv_len = NK
        if PADDING:
            kv_len = tl.load(KLEN + b)
        hi = kv_len
        if CAUSAL:
            hi = tl.minimum(hi, tl.maximum((pid_m + 1) * BLOCK_M + OFFSET, 0))
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            col_ok = cols < kv_len
            kv_io = col_ok[:, None] & d_ok[None, :]
            k = tl.load(K + b * skb + hk * skh + cols[:, None] * skn + offs_d[None, :],
                        mask=kv_io, other=0.0)
            v = tl.load(V + b * svb + hk * svh + cols[:, None] * svn + offs_d[None, :],
                        mask=kv_io, other=0.0)
            if DOT_F32:
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
                dp = tl.dot(do.to(tl.float32), tl.trans(v.to(tl.float32)))
            else:
                s = tl.dot(q, tl.trans(k))
                dp = tl.dot(do, tl.trans(v))
            p = tl.exp2(s * scale_log2 - lse2[:, None])
            valid = col_ok[None, :] & row_ok[:, None]
            if CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None] + OFFSET)
            if DENSE:
                mk = tl.load(MASK + b * smb + offs_m[:, None] * smm + cols[None, :] * smn,
                             mask=row_ok[:, None] & col_ok[None, :], other=0)
                valid = valid & (mk != 0)
            p = tl.where(valid, p, 0.0)
            ds = p * (dp - delta[:, None])
            if DOT_F32:
                dq += tl.dot(ds.to(q.dtype).to(tl.float32), k.to(tl.float32))
            else:
                dq += tl.dot(ds.to(q.dtype), k)
        tl.store(DQ + b * sgb + h * sgh + offs_m[:, None] * sgn + offs_d[None, :],
                 (dq * scale).to(DQ.dtype.element_ty), mask=io)

    skip = _SHAPE_ARGS + ([] if aligned else _STRIDE_ARGS)
    return (triton.jit(fa2_bwd_dkdv, do_not_specialize=skip),
            triton.jit(fa2_bwd_dq, do_not_specialize=[a for a in skip
                                                      if a not in ("HK", "sxb", "sxh", "sxn")]))


def _tiles(block_d: int) -> tuple[int, int, int, int, int, int]:
    """(dkdv BLOCK_M, BLOCK_N, dq BLOCK_M, BLOCK_N, num_warps, num_stages)."""
    if _interpret():
        return 16, 32, 32, 16, 4, 1
    if block_d <= 64:
        return 32, 128, 128, 32, 4, 3
    if block_d <= 128:
        return 32, 128, 128, 32, 8, 3
    return 16, 64, 64, 16, 8, 2


def _strides3(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def triton_fa2_bwd_fn(q, k, v, out, lse, dout, *, mask_kind, mask, key_lengths,
                      causal_offset, scale, window_left=-1, window_right=-1, layout="dense",
                      serving=None, max_seqlen_q=None, max_seqlen_k=None):
    """dQ, dK, dV of the module doc (the protocol of harness.candidates.python_candidate).
    Dense and windowless only: the protocol skips the other cases' backward (the forward
    declares the serving keywords, so they come here too)."""
    if layout != "dense" or window_left >= 0 or window_right >= 0:
        raise ValueError("the Triton backward takes the dense layout without a window")
    B, H, Nq, d = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    if d > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {d} > {MAX_HEAD_DIM}")
    q, k, v, dout = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, dout))
    lse = lse.contiguous()
    delta = (dout.float() * out.float()).sum(-1).contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    block_d = max(16, 1 << (d - 1).bit_length())
    m1, n1, m2, n2, warps, stages = _tiles(block_d)
    dense = mask_kind == "random"
    padding = mask_kind == "key_padding"
    if dense:
        m = mask.expand(-1, 1, Nq, Nk) if mask.shape[2] == 1 else mask
        m = m.contiguous().view(torch.uint8)
        smb = m.stride(0) if m.shape[0] != 1 else 0
        sm = (smb, m.stride(2), m.stride(3))
    else:
        m, sm = delta, (0, 0, 0)  # unused pointer
    klen = key_lengths.to(device=q.device, dtype=torch.int32) if padding else delta
    aligned = all(st % 16 == 0 for t in (q, k, v, dout, dq, dk, dv) for st in t.stride()[:3])
    dkdv, dqk = _kernels(aligned)
    flags = dict(HEAD_D=d, BLOCK_D=block_d, CAUSAL=mask_kind in ("causal_br", "causal_tl"),
                 PADDING=padding, DENSE=dense,
                 DOT_F32=_interpret() and q.dtype == torch.bfloat16,
                 num_warps=warps, num_stages=stages)
    common = (*_strides3(q), *_strides3(k), *_strides3(v), *_strides3(dout))
    log2e = scale * 1.4426950408889634
    dkdv[(math.ceil(Nk / n1), B * Hk)](
        q, k, v, dout, lse, delta, dk, dv, m, klen, *common, *_strides3(dk), *_strides3(dv),
        lse.stride(0), lse.stride(1), *sm, H, Hk, H // Hk, Nq, Nk, causal_offset, scale, log2e,
        BLOCK_M=m1, BLOCK_N=n1, **flags)
    dqk[(math.ceil(Nq / m2), B * H)](
        q, k, v, dout, lse, delta, dq, m, klen, *common, *_strides3(dq),
        lse.stride(0), lse.stride(1), *sm, H, H // Hk, Nq, Nk, causal_offset, scale, log2e,
        BLOCK_M=m2, BLOCK_N=n2, **flags)
    return dq, dk, dv
