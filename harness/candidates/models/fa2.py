"""FlashAttention-2 forward on the CPU: outer loop over Q blocks, inner loop over K/V blocks,
online softmax (FA2 paper Algorithm 1; the seed chapter's 14.5 pseudocode).

Per Q block, O, m and l live in "registers" (local tensors) for the whole inner loop and
reach HBM once, at the end. Masks add two things to the pseudocode:
- the -inf guard: a row whose running max is still -inf (no visible key yet) subtracts 0
  instead, so exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN;
- fully masked rows end with l = 0: O = 0 and LSE = -inf.

Bytes, per (b, h) program and Q block: Q tile once, every visited K and V tile, O tile
once, LSE once. K/V tiles entirely above the causal diagonal are skipped, not loaded.

The backward is FA2's Algorithm 2 (harness.candidates.models.fa2_bwd).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.candidates.models import tiles as T
from harness.candidates.models.base import ModelCandidate
from harness.candidates.models.fa2_bwd import FA2Backward
from harness.core.candidate import Support
from harness.core.cases import Case, Inputs

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # O (unnormalised), m, l


@dataclass
class FA2Model(FA2Backward, ModelCandidate):
    name: str = "fa2_model"
    algorithm: str = "fa2"
    description: str = ("FA2 on the CPU: forward outer Q blocks, inner K/V blocks, online "
                        "softmax; backward outer K/V blocks, inner Q blocks")
    # Its backward (harness.candidates.models.fa2_bwd) sums dQ block by block in order:
    # deterministic.
    support: Support = field(default_factory=lambda: Support(
        masked_lse="-inf", backward=True, backward_deterministic=True))
    # Bytes moved by the last `run_backward` (None before the first one).
    last_bytes_bwd: T.ByteCounter | None = field(default=None, repr=False, compare=False)

    def compute(self, case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None,
                counter: T.ByteCounter) -> None:
        es = T.elem_size(case)
        all_keys = self.key_tiles(case)
        for r0, r1 in self.query_tiles(case):
            o, m, lsum = self.attend_rows(case, inputs, (r0, r1), all_keys, counter)
            o, blk_lse = self.finish(o, m, lsum)
            out[:, :, r0:r1] = o.to(out.dtype)
            counter.write("O", T.tile_bytes(case, r1 - r0, case.head_dim, es))
            if lse is not None:
                lse[:, :, r0:r1] = blk_lse
                counter.write("LSE", T.tile_bytes(case, r1 - r0, 1, T.F32_BYTES))

    def attend_rows(self, case: Case, inputs: Inputs, rows: tuple[int, int],
                    key_tiles: list[tuple[int, int]], counter: T.ByteCounter) -> State:
        """The inner loop for one Q block over `key_tiles`: returns the final O, m, l."""
        es = T.elem_size(case)
        d = case.head_dim
        r0, r1 = rows
        heads = self.kv_heads(case)
        q = T.load_tile(inputs.q, None, r0, r1)
        counter.read("Q", T.tile_bytes(case, r1 - r0, d, es))
        state = self.init_state(case, r1 - r0)
        end = self.key_end(case, r1)
        for c0, c1 in key_tiles:
            if c0 >= end:
                continue
            k = T.load_tile(inputs.k, heads, c0, c1)
            v = T.load_tile(inputs.v, heads, c0, c1)
            counter.read("K", T.tile_bytes(case, c1 - c0, d, es))
            counter.read("V", T.tile_bytes(case, c1 - c0, d, es))
            s = self.scores(case, inputs, q, k, rows, (c0, c1), counter)
            state = self.online_step(state, s, v)
        return state

    @staticmethod
    def init_state(case: Case, rows: int) -> State:
        shape = (case.batch, case.heads, rows)
        return (torch.zeros(*shape, case.head_dim), torch.full(shape, T.NEG_INF),
                torch.zeros(shape))

    def online_step(self, state: State, s: torch.Tensor, v: torch.Tensor) -> State:
        o, m, lsum = state
        m_new = torch.maximum(m, s.amax(dim=-1))
        m_use = torch.where(m_new == T.NEG_INF, 0.0, m_new)  # the -inf guard
        p = torch.exp(s - m_use[..., None])
        alpha = torch.exp(m - m_use)  # 0 while m is -inf, 1 when the max did not move
        lsum = alpha * lsum + p.sum(dim=-1)
        o = alpha[..., None] * o + torch.matmul(p, v)
        return o, m_new, lsum

    def finish(self, o: torch.Tensor, m: torch.Tensor, lsum: torch.Tensor,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Final division by l and LSE = m + log(l); l = 0 (no visible key) gives O = 0
        (O is still all zeros there) and LSE = -inf."""
        empty = lsum == 0
        o = o / torch.where(empty, 1.0, lsum)[..., None]
        lse = torch.where(empty, T.NEG_INF, m + torch.log(lsum))
        return o, lse
