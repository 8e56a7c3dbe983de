"""FlashAttention (v1) forward on the CPU: FA1 paper Algorithm 1, outer loop over K/V
blocks of B_k, inner loop over Q blocks of B_q.

O, m and l live in HBM and are initialised there (O = 0, l = 0, m = -inf). Each outer
iteration loads one K/V block once; for every Q block it then reads Q_i, O_i, l_i, m_i
back from HBM, folds the K/V block in, and writes O_i (normalised by the new l), l_i and
m_i back. An epilogue turns the O workspace into the output dtype and m, l into
LSE = m + log(l).

O is kept in HBM as a float32 workspace (as FA1's CUDA code kept its partial outputs):
rounding a normalised O to fp16/bf16 after every K/V block accumulates one rounding per
block and, at a few dozen blocks, exceeds the 2x-of-naive tolerance. So the O terms are
counted at 4 bytes per element, and the epilogue adds read O, m, l / write O, LSE once.

Masks: the -inf guard applies to both the block max and the running max; a row that never
sees a key keeps O = 0 from the initialisation, l = 0 and so LSE = -inf. Q blocks that lie
entirely before the causal diagonal of a K/V block skip that block (no loads, no stores).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.candidates.models import tiles as T
from harness.candidates.models.base import ModelCandidate
from harness.core.cases import Case, Inputs


@dataclass
class FA1Model(ModelCandidate):
    name: str = "fa1_model"
    algorithm: str = "fa1"
    description: str = "FA1 forward on the CPU: outer K/V blocks, inner Q blocks, O/m/l in HBM"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.tiles = {**self.tiles, "acc_bytes": T.F32_BYTES}

    def compute(self, case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None,
                counter: T.ByteCounter) -> None:
        es = T.elem_size(case)
        acc = T.F32_BYTES
        d = case.head_dim
        n_rows = case.batch * case.heads * case.seqlen_q
        heads = self.kv_heads(case)
        shape = (case.batch, case.heads, case.seqlen_q)
        # The HBM state, initialised in HBM as the paper does.
        o_hbm = torch.zeros(*shape, d)
        m_hbm = torch.full(shape, T.NEG_INF)
        l_hbm = torch.zeros(shape)
        counter.write("O", n_rows * d * acc)
        counter.write("m", n_rows * T.F32_BYTES)
        counter.write("l", n_rows * T.F32_BYTES)
        q_tiles = self.query_tiles(case)
        for c0, c1 in self.key_tiles(case):
            k = T.load_tile(inputs.k, heads, c0, c1)
            v = T.load_tile(inputs.v, heads, c0, c1)
            counter.read("K", T.tile_bytes(case, c1 - c0, d, es))
            counter.read("V", T.tile_bytes(case, c1 - c0, d, es))
            for r0, r1 in q_tiles:
                if c0 >= self.key_end(case, r1):
                    continue  # the whole K/V block is above the causal diagonal of this Q block
                rows = r1 - r0
                q = T.load_tile(inputs.q, None, r0, r1)
                counter.read("Q", T.tile_bytes(case, rows, d, es))
                counter.read("O", T.tile_bytes(case, rows, d, acc))
                counter.read("m", T.tile_bytes(case, rows, 1, T.F32_BYTES))
                counter.read("l", T.tile_bytes(case, rows, 1, T.F32_BYTES))
                s = self.scores(case, inputs, q, k, (r0, r1), (c0, c1), counter)
                o_i, m_i, l_i = self.block_update(o_hbm[:, :, r0:r1], m_hbm[:, :, r0:r1],
                                                  l_hbm[:, :, r0:r1], s, v)
                o_hbm[:, :, r0:r1] = o_i
                m_hbm[:, :, r0:r1] = m_i
                l_hbm[:, :, r0:r1] = l_i
                counter.write("O", T.tile_bytes(case, rows, d, acc))
                counter.write("m", T.tile_bytes(case, rows, 1, T.F32_BYTES))
                counter.write("l", T.tile_bytes(case, rows, 1, T.F32_BYTES))
        # Epilogue: the output in its dtype, and LSE (a row that saw no key has l = 0).
        out.copy_(o_hbm.to(out.dtype))
        counter.read("O", n_rows * d * acc)
        counter.write("O", n_rows * d * es)
        if lse is not None:
            lse.copy_(torch.where(l_hbm == 0, T.NEG_INF, m_hbm + torch.log(l_hbm)))
            counter.read("m", n_rows * T.F32_BYTES)
            counter.read("l", n_rows * T.F32_BYTES)
            counter.write("LSE", n_rows * T.F32_BYTES)

    @staticmethod
    def block_update(o: torch.Tensor, m: torch.Tensor, lsum: torch.Tensor, s: torch.Tensor,
                     v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Fold one K/V block into normalised O_i with statistics m_i, l_i (paper lines
        9-13): block max and sum first, then the two rescales into the new max."""
        m_blk = s.amax(dim=-1)
        p = torch.exp(s - torch.where(m_blk == T.NEG_INF, 0.0, m_blk)[..., None])
        l_blk = p.sum(dim=-1)
        m_new = torch.maximum(m, m_blk)
        m_use = torch.where(m_new == T.NEG_INF, 0.0, m_new)
        a_old = torch.exp(m - m_use)  # 0 for a row with no key seen so far
        a_blk = torch.exp(m_blk - m_use)  # 0 for a row with no visible key in this block
        l_new = a_old * lsum + a_blk * l_blk
        acc = (lsum * a_old)[..., None] * o + a_blk[..., None] * torch.matmul(p, v)
        o_new = acc / torch.where(l_new == 0, 1.0, l_new)[..., None]
        return o_new, m_new, l_new
