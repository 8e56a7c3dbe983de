"""Naive attention in three steps, the data flow of an unfused implementation:

1. S = Q K^T * scale, written to HBM as a full (Nq, Nk) matrix per (b, h);
2. softmax in three passes over S: row max, row sum of exp, normalise (writes P);
3. O = P V.

Scores, probabilities and accumulation are float32 (like the float32 intermediates of an
eager implementation that upcasts), the output is cast to the input dtype. S and P are
therefore counted at 4 bytes per element (`tiles["score_bytes"]`). LSE = max + log(sum) is
written as well (4 bytes per row). Fully masked rows: O = 0, LSE = -inf.

The matrices are materialised for a few (b, h) pairs at a time, to bound the memory the
model needs; the bytes are those of the whole algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.candidates.models import tiles as T
from harness.candidates.models.base import ModelCandidate
from harness.core.cases import Case, Inputs, MaskKind

# Elements of S one chunk of (b, h) pairs may hold (S and P in float32: ~512 MiB).
_CHUNK_ELEMS = 1 << 26


@dataclass
class NaiveModel(ModelCandidate):
    name: str = "naive_model"
    algorithm: str = "naive_3pass"
    description: str = "naive 3-step attention: S in HBM, 3-pass softmax, P in HBM, PV"

    def __post_init__(self) -> None:
        super().__post_init__()
        # Whole-matrix algorithm: the block sizes mean nothing to it.
        self.tiles = {"score_bytes": T.F32_BYTES}

    def compute(self, case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None,
                counter: T.ByteCounter) -> None:
        b, h, nq, nk, d = case.batch, case.heads, case.seqlen_q, case.seqlen_k, case.head_dim
        es = T.elem_size(case)
        sb = T.F32_BYTES
        heads = self.kv_heads(case)
        offset = self.causal_offset(case)
        scale = self.softmax_scale(case)
        per_head = max(1, _CHUNK_ELEMS // max(nq * nk, 1))
        for bi in range(b):
            for h0 in range(0, h, per_head):
                hs = slice(h0, min(h0 + per_head, h))
                q = inputs.q[bi:bi + 1, hs].float()
                k = inputs.k[bi:bi + 1].index_select(1, heads[hs]).float()
                v = inputs.v[bi:bi + 1].index_select(1, heads[hs]).float()
                # Step 1: S = Q K^T, masked, in HBM.
                s = torch.matmul(q, k.transpose(-1, -2)) * scale
                vis = T.tile_visibility(case, _batch_entry(inputs, bi), (0, nq), (0, nk), offset,
                                        use_mask=self.uses_mask_tensor(case))
                if vis is not None:
                    s = s.masked_fill(~vis, self.mask_fill)
                # Step 2, pass 1: row max.
                mx = s.amax(dim=-1, keepdim=True)
                mx = torch.where(mx == T.NEG_INF, 0.0, mx)  # fully masked row: exp(-inf) = 0
                # Pass 2: row sum of exp (the exps are not stored; pass 3 recomputes them).
                sm = torch.exp(s - mx).sum(dim=-1, keepdim=True)
                # Pass 3: normalise into P.
                p = torch.exp(s - mx) / torch.where(sm == 0, 1.0, sm)
                # Step 3: O = P V.
                out[bi:bi + 1, hs] = torch.matmul(p, v).to(out.dtype)
                if lse is not None:
                    lse[bi:bi + 1, hs] = torch.where(sm == 0, T.NEG_INF,
                                                     mx + torch.log(sm)).squeeze(-1)
        n_bh = b * h
        counter.read("Q", n_bh * nq * d * es)
        counter.read("K", n_bh * nk * d * es)
        counter.write("S", n_bh * nq * nk * sb)
        counter.read("S", 3 * n_bh * nq * nk * sb)
        counter.write("P", n_bh * nq * nk * sb)
        counter.read("P", n_bh * nq * nk * sb)
        counter.read("V", n_bh * nk * d * es)
        counter.write("O", n_bh * nq * d * es)
        if lse is not None:
            counter.write("LSE", n_bh * nq * T.F32_BYTES)
        if inputs.mask is not None and self.uses_mask_tensor(case) and case.mask is MaskKind.RANDOM:
            counter.read("mask", n_bh * nq * nk)


def _batch_entry(inputs: Inputs, bi: int) -> Inputs:
    """The inputs of one batch entry (the mask sliced to it, if it has a batch dim)."""
    mask = inputs.mask
    if mask is not None and mask.shape[0] != 1:
        mask = mask[bi:bi + 1]
    return Inputs(inputs.q, inputs.k, inputs.v, mask, inputs.key_lengths, inputs.serving)
