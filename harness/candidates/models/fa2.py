"""FlashAttention-2 forward on the CPU: outer loop over Q blocks, inner loop over K/V blocks,
online softmax (FA2 paper Algorithm 1; the seed chapter's 14.5 pseudocode).

Per Q block, O, m and l live in "registers" (local tensors) for the whole inner loop and
reach HBM once, at the end. Masks add two things to the pseudocode:
- the -inf guard: a row whose running max is still -inf (no visible key yet) subtracts 0
  instead, so exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN;
- fully masked rows end with l = 0: O = 0 and LSE = -inf.

Bytes, per (b, h) program and Q block: Q tile once, every visited K and V tile, O tile
once, LSE once. K/V tiles entirely above the causal diagonal, or outside every row's
sliding window, are skipped, not loaded.

Varlen and paged cases (harness.core.serving) run per sequence, as a kernel's grid of
(sequence, head, Q block) programs does: the lengths, slot starts and block table are read
from `inputs.serving`; each sequence's Q blocks tile its own rows, its K/V blocks its own
keys (paged: looked up in the block table per key tile), and only its rows are stored, so
the padding rows of a packed batch stay unwritten. A sequence with no query row costs
nothing; one with an empty cache stores O = 0 and LSE = -inf without reading anything.

Score modifiers (dense cases): softcap and the ALiBi bias are applied to each score tile
(`ModelCandidate.scores`), before the mask; a sink is folded in after the K/V loop as one
more key with score `sink` and value 0 (`finish_sink`), so O is rescaled, l grows and LSE
includes it.

FP8 inputs (harness.core.fp8): each Q and K/V tile is dequantized as it is loaded
(`ModelCandidate.dequant`: e4m3 values times their descales, gathered per page slot for a
paged cache's per-token scales), then everything runs in float32 as above; e4m3 tiles
count 1 byte an element, per-token descales 4 bytes a row, per-head ones once per (b, h).

The backward is FA2's Algorithm 2 (harness.candidates.models.fa2_bwd), dense only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.candidates.models import tiles as T
from harness.candidates.models.base import ModelCandidate
from harness.candidates.models.fa2_bwd import FA2Backward
from harness.candidates.models.sequences import SeqView, sequences
from harness.core.candidate import Support
from harness.core.cases import Case, Inputs, Layout

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # O (unnormalised), m, l


@dataclass
class FA2Model(FA2Backward, ModelCandidate):
    name: str = "fa2_model"
    algorithm: str = "fa2"
    description: str = ("FA2 on the CPU: forward outer Q blocks, inner K/V blocks, online "
                        "softmax, varlen batches and sliding windows; backward outer K/V "
                        "blocks, inner Q blocks")
    # Its backward (harness.candidates.models.fa2_bwd) sums dQ block by block in order:
    # deterministic.
    support: Support = field(default_factory=lambda: Support(
        masked_lse="-inf", backward=True, backward_deterministic=True,
        layouts=frozenset({Layout.DENSE, Layout.VARLEN}), window=True, softcap=True,
        alibi=True, sinks=True, head_dim_v=True, fp8=True, fp8_kv=True))
    # Bytes moved by the last `run_backward` (None before the first one).
    last_bytes_bwd: T.ByteCounter | None = field(default=None, repr=False, compare=False)

    def supports_backward(self, case: Case) -> str | None:
        if case.is_serving or case.has_window or case.has_score_mods or case.head_dim_v:
            return ("the backward model covers dense cases without a sliding window, score "
                    "modifiers or a head_dim_v of their own")
        return None

    def compute(self, case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None,
                counter: T.ByteCounter) -> None:
        if not case.is_serving:
            self.attend(case, inputs, None, out, lse, counter)
            return
        for seq in sequences(case, inputs.serving):
            if seq.q_len == 0:
                continue  # no program has rows to compute
            if seq.k_len == 0:  # an empty cache: every row fully masked, nothing read
                shape = (1, case.heads, seq.q_len)
                self.store_rows(seq, out, lse, 0, torch.zeros(*shape, case.dv),
                                torch.full(shape, T.NEG_INF), counter)
                continue
            self.attend(seq.dense_case(case), seq.inputs(inputs), seq, out, lse, counter)

    def attend(self, case: Case, inputs: Inputs, seq: SeqView | None, out: torch.Tensor,
               lse: torch.Tensor | None, counter: T.ByteCounter) -> None:
        """All Q blocks of a dense problem (`case`: the whole dense case, or one sequence
        as a dense problem of its own lengths), stored through `store_rows`."""
        all_keys = self.key_tiles(case)
        self.read_descales(case, counter)
        # The sink logits: H floats, read once per program (not counted, as the IO model
        # does not count them).
        sink = None if inputs.sinks is None else inputs.sinks.float()[None, :, None]
        for r0, r1 in self.query_tiles(case):
            o, m, lsum = self.attend_rows(case, inputs, (r0, r1), all_keys, counter)
            if sink is None:
                o, blk_lse = self.finish(o, m, lsum)
            else:
                o, blk_lse = self.finish_sink(o, m, lsum, sink)
            self.store_rows(seq, out, lse, r0, o, blk_lse, counter)

    def attend_rows(self, case: Case, inputs: Inputs, rows: tuple[int, int],
                    key_tiles: list[tuple[int, int]], counter: T.ByteCounter) -> State:
        """The inner loop for one Q block over `key_tiles`: returns the final O, m, l."""
        eq, ekv, row_scale = T.input_sizes(case)
        d, dv = case.head_dim, self.v_dim(case)
        r0, r1 = rows
        heads = self.kv_heads(case)
        q = self.load_q(case, inputs, r0, r1)
        counter.read("Q", T.tile_bytes(case, r1 - r0, d, eq))
        state = self.init_state(case, r1 - r0)
        start, end = self.key_span(case, rows)
        for c0, c1 in key_tiles:
            if c0 >= end or c1 <= start:
                continue
            k, v = self.load_kv(case, inputs, heads, c0, c1)
            c1 = c0 + k.shape[2]  # a tile cut short where the tensor ends
            if c1 <= c0:
                continue
            n = c1 - c0  # rows, each with its own descale under per-token scales
            counter.read("K", T.tile_bytes(case, n, d, ekv) + T.tile_bytes(case, n, 1, row_scale))
            counter.read("V", T.tile_bytes(case, n, min(dv, v.shape[3]), ekv)
                         + T.tile_bytes(case, n, 1, row_scale))
            s = self.scores(case, inputs, q, k, rows, (c0, c1), counter)
            state = self.online_step(state, s, v[..., :dv])
        return state

    @staticmethod
    def read_descales(case: Case, counter: T.ByteCounter) -> None:
        """An fp8 problem's per-tensor or per-head descales, read once per (b, h)."""
        if T.descale_bytes(case):
            counter.read("descales", T.descale_bytes(case))

    def init_state(self, case: Case, rows: int) -> State:
        shape = (case.batch, case.heads, rows)
        dv = min(self.v_dim(case), case.dv)  # the columns of V there are
        return (torch.zeros(*shape, dv), torch.full(shape, T.NEG_INF),
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

    def finish_sink(self, o: torch.Tensor, m: torch.Tensor, lsum: torch.Tensor,
                    sink: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`finish` with a sink logit (1, H, 1): folded in as one more key of score `sink`
        and value 0, so the running max takes it, l gains exp(sink - m) and O is only
        rescaled. l > 0 then: a row with no visible key ends with O = 0, LSE = sink."""
        m_new = torch.maximum(m, sink.expand_as(m))  # finite: the sink is
        alpha = torch.exp(m - m_new)
        lsum = alpha * lsum + torch.exp(sink - m_new)
        return self.finish(alpha[..., None] * o, m_new, lsum)

    def finish(self, o: torch.Tensor, m: torch.Tensor, lsum: torch.Tensor,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Final division by l and LSE = m + log(l); l = 0 (no visible key) gives O = 0
        (O is still all zeros there) and LSE = -inf."""
        empty = lsum == 0
        o = o / torch.where(empty, 1.0, lsum)[..., None]
        lse = torch.where(empty, T.NEG_INF, m + torch.log(lsum))
        return o, lse
