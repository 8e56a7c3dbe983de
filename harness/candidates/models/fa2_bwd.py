"""FlashAttention-2's backward on the CPU (FA2 paper Algorithm 2; the seed chapter: the
backward goes back to the outer-K/V, inner-Q loop order, so dQ needs atomic
accumulation), counting the HBM bytes its loops move.

1. Preprocess: D = rowsum(dO * O), one float32 per query row, written to HBM.
2. For each K/V block j (the outer loop; one "program" per (b, h, j)): K_j and V_j are
   loaded once, dK_j and dV_j live in registers. For each Q block i that sees a key of
   the block (the causal tiles above the diagonal are skipped, as in the forward): load
   Q_i, dO_i, LSE_i and D_i; recompute S = scale Q_i K_j^T with the mask and
   P = exp(S - LSE_i) (the -inf guard: a row with LSE = -inf, no visible key, has P = 0);
   then dV_j += P^T dO_i, dP = dO_i V_j^T, dS = P * (dP - D_i), dK_j += scale dS^T Q_i,
   and dQ_i += scale dS K_j into a float32 accumulator in HBM (read and written: the
   atomics of the GPU kernel; here the blocks run one after the other, so the sum is
   deterministic).
3. dK_j and dV_j are written once; with GQA each query head writes float32 partials that
   a reduction sums per K/V head. An epilogue turns the dQ accumulator into dQ.

Each step a kernel engineer can get wrong is a method, so a planted bug
(harness.candidates.models.planted_bwd) overrides exactly one.
"""

from __future__ import annotations

import torch

from harness.candidates.models import tiles as T
from harness.core.cases import Case, GradInputs


class FA2Backward:
    """The backward of a model candidate (mixed into FA2Model); uses its steps (scale,
    head map, causal offset, tiles, scores) so the forward and backward share them."""

    def run_backward(self, case: Case, inputs: GradInputs, dq: torch.Tensor,
                     dk: torch.Tensor, dv: torch.Tensor) -> None:
        counter = T.ByteCounter()
        with torch.no_grad():
            self.compute_backward(case, inputs.to("cpu"), dq, dk, dv, counter)
        self.last_bytes_bwd = counter

    def compute_backward(self, case: Case, inputs: GradInputs, dq: torch.Tensor,
                         dk: torch.Tensor, dv: torch.Tensor, counter: T.ByteCounter) -> None:
        es, d = T.elem_size(case), case.head_dim
        n_rows = case.batch * case.heads * case.seqlen_q
        dout = inputs.dout.float()
        lse = inputs.lse.float()
        # 1. D = rowsum(dO * O)
        delta = self.delta(dout, inputs.out.float())
        counter.read("dO", n_rows * d * es)
        counter.read("O", n_rows * d * es)
        counter.write("D", n_rows * T.F32_BYTES)
        heads = self.kv_heads(case)
        scale = self.ds_scale(case)
        dq_acc = self.dq_accumulator(case)
        dk_heads = torch.zeros(case.batch, case.heads, case.seqlen_k, d)
        dv_heads = torch.zeros(case.batch, case.heads, case.seqlen_k, d)
        q_tiles = self.query_tiles(case)
        # 2. the outer loop over K/V blocks
        for c0, c1 in self.key_tiles(case):
            k = T.load_tile(inputs.k, heads, c0, c1)
            v = T.load_tile(inputs.v, heads, c0, c1)
            counter.read("K", T.tile_bytes(case, c1 - c0, d, es))
            counter.read("V", T.tile_bytes(case, c1 - c0, d, es))
            dk_j = torch.zeros(case.batch, case.heads, c1 - c0, d)
            dv_j = torch.zeros_like(dk_j)
            for r0, r1 in q_tiles:
                if not self.sees(case, (r0, r1), c0):
                    continue
                n = r1 - r0
                q = T.load_tile(inputs.q, None, r0, r1)
                do = dout[:, :, r0:r1]
                counter.read("Q", T.tile_bytes(case, n, d, es))
                counter.read("dO", T.tile_bytes(case, n, d, es))
                counter.read("LSE", T.tile_bytes(case, n, 1, T.F32_BYTES))
                counter.read("D", T.tile_bytes(case, n, 1, T.F32_BYTES))
                s = self.backward_scores(case, inputs, q, k, (r0, r1), (c0, c1), counter)
                p = self.probabilities(s, lse[:, :, r0:r1])
                dv_j += torch.matmul(p.transpose(-1, -2), do)
                dp = torch.matmul(do, v.transpose(-1, -2))
                ds = p * (dp - delta[:, :, r0:r1, None])
                dk_j += torch.matmul(ds.transpose(-1, -2), q) * scale
                counter.read("dQ_acc", T.tile_bytes(case, n, d, T.F32_BYTES))
                counter.write("dQ_acc", T.tile_bytes(case, n, d, T.F32_BYTES))
                self.accumulate_dq(dq_acc, (r0, r1), torch.matmul(ds, k) * scale, c0)
            dk_heads[:, :, c0:c1] = dk_j
            dv_heads[:, :, c0:c1] = dv_j
        # 3. dK, dV per K/V head (GQA: partials summed), and dQ from its accumulator
        self.write_kv_grads(case, dk_heads, dv_heads, dk, dv, counter)
        counter.read("dQ_acc", n_rows * d * T.F32_BYTES)
        dq.copy_(dq_acc.to(dq.dtype))
        counter.write("dQ", n_rows * d * es)

    def write_kv_grads(self, case: Case, dk_heads: torch.Tensor, dv_heads: torch.Tensor,
                       dk: torch.Tensor, dv: torch.Tensor, counter: T.ByteCounter) -> None:
        es, d = T.elem_size(case), case.head_dim
        kv_rows = case.batch * case.kv_heads * case.seqlen_k
        if case.group_size > 1:
            partial = case.batch * case.heads * case.seqlen_k * d * T.F32_BYTES
            counter.write("dK_partial", partial)
            counter.write("dV_partial", partial)
            counter.read("dK_partial", partial)
            counter.read("dV_partial", partial)
        dk.copy_(self.reduce_group(case, dk_heads).to(dk.dtype))
        dv.copy_(self.reduce_group(case, dv_heads).to(dv.dtype))
        counter.write("dK", kv_rows * d * es)
        counter.write("dV", kv_rows * d * es)

    # --- the steps a planted bug may override -------------------------------------------

    def delta(self, dout: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """D = rowsum(dO * O): (B, H, Nq)."""
        return (dout * out).sum(dim=-1)

    def ds_scale(self, case: Case) -> float:
        """The softmax scale of dQ = scale dS K and dK = scale dS^T Q."""
        return self.softmax_scale(case)

    def backward_scores(self, case: Case, inputs: GradInputs, q: torch.Tensor,
                        k: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int],
                        counter: T.ByteCounter) -> torch.Tensor:
        """The recomputed, masked scores of one tile: the forward's `scores`."""
        return self.scores(case, inputs, q, k, rows, cols, counter)

    def probabilities(self, s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        """P = exp(S - LSE) with the -inf guard: LSE = -inf (no visible key) gives P = 0."""
        live = torch.isfinite(lse)
        return torch.exp(s - torch.where(live, lse, 0.0)[..., None]) * live[..., None]

    def dq_accumulator(self, case: Case) -> torch.Tensor:
        """The float32 dQ accumulator (B, H, Nq, d), zeroed for this call (the GPU kernel's
        pre-pass zeroes its workspace on every call)."""
        return torch.zeros(case.batch, case.heads, case.seqlen_q, case.head_dim)

    def accumulate_dq(self, acc: torch.Tensor, rows: tuple[int, int], update: torch.Tensor,
                      key_start: int) -> None:
        """dQ_i += the update of one K/V block (the GPU kernel's atomicAdd)."""
        acc[:, :, rows[0]:rows[1]] += update

    def reduce_group(self, case: Case, per_head: torch.Tensor) -> torch.Tensor:
        """(B, H, Nk, d) per query head -> (B, Hkv, Nk, d): each K/V head's G query heads
        summed."""
        g = case.group_size
        return per_head.reshape(case.batch, case.kv_heads, g, case.seqlen_k,
                                case.head_dim).sum(dim=2)

    def sees(self, case: Case, rows: tuple[int, int], key_start: int) -> bool:
        """Whether any row of the Q block sees a key from `key_start` on (causal tile
        skipping: blocks entirely above the diagonal are not visited)."""
        return key_start < self.key_end(case, rows[1])
