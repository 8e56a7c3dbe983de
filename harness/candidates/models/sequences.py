"""The sequences of a varlen or paged batch, as a kernel's programs find them.

A serving kernel reads only the index tensors (harness.core.serving.ServingIndex): the
lengths `seqlens_q[b]` and `seqlens_k[b]`, the slot starts `cu_seqlens_q[b]` and
`cu_seqlens_k[b]` of the packed layout, the block table of the paged one. `sequences`
turns them into one `SeqView` per batch entry, and a model runs its dense tile loops over
each sequence's own rows and keys (`SeqView.dense_case`, `SeqView.inputs`): the
sequence's q rows, and K/V that the model's `load_kv` reads from the packed tensors at
the sequence's first key (varlen) or page by page through the table (paged).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from harness.core.cases import Case, Inputs, Layout


@dataclass(frozen=True)
class SeqView:
    """Sequence `b` of a serving batch: its lengths and where its rows and keys lie."""

    b: int
    q_len: int
    k_len: int
    q_row: int  # varlen: its first row in the packed q and out; paged: 0 (q and out [b])
    k_row: int  # varlen: its first key in the packed k and v; paged: 0
    table: torch.Tensor | None = None  # paged: the whole block table (B, width), int64
    page_size: int = 0

    @property
    def paged(self) -> bool:
        return self.table is not None

    def dense_case(self, case: Case) -> Case:
        """The sequence as a dense problem of its own lengths (batch 1, the case's heads,
        mask and window): the shape its tile loops run over. Needs q_len, k_len >= 1."""
        return dataclasses.replace(case, batch=1, seqlen_q=self.q_len, seqlen_k=self.k_len,
                                   layout=Layout.DENSE, page_size=0, full_lengths=False)

    def inputs(self, inputs: Inputs) -> Inputs:
        """The sequence's q rows (1, H, q_len, d), the whole K/V tensors (the packed keys
        or the page pool, read through `load_kv`) with their descales (an fp8 cache's)
        and this view as `serving`."""
        if self.paged:
            q = inputs.q[self.b:self.b + 1]
        else:
            q = inputs.q[:, :, self.q_row:self.q_row + self.q_len]
        return Inputs(q, inputs.k, inputs.v, serving=self, k_descale=inputs.k_descale,
                      v_descale=inputs.v_descale)

    def rows(self, t: torch.Tensor) -> torch.Tensor:
        """The view of an output (out or lse) from the sequence's first row on: the
        pointer a kernel's program offsets by cu_seqlens_q[b] (varlen) or by the batch
        stride (paged). A store past the sequence's rows lands in what follows."""
        if self.paged:
            return t[self.b:self.b + 1]
        return t[:, :, self.q_row:]


def sequences(case: Case, index) -> list[SeqView]:
    """One SeqView per batch entry, from the index tensors (int32, read as a kernel does:
    lengths from seqlens_q/seqlens_k, never from the slot widths)."""
    q_lens = [int(x) for x in index.seqlens_q.tolist()]
    k_lens = [int(x) for x in index.seqlens_k.tolist()]
    if case.layout is Layout.VARLEN:
        q_rows = [int(x) for x in index.cu_seqlens_q.tolist()]
        k_rows = [int(x) for x in index.cu_seqlens_k.tolist()]
        return [SeqView(b, q_lens[b], k_lens[b], q_rows[b], k_rows[b])
                for b in range(case.batch)]
    table = index.block_table.long()
    return [SeqView(b, q_lens[b], k_lens[b], 0, 0, table, case.page_size)
            for b in range(case.batch)]


def gather_keys(pool: torch.Tensor, pages: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Keys (or values) at (page, slot) pairs of a (P, Hkv, page_size, d) pool, as a
    (1, Hkv, n, d) tile."""
    return pool[pages, :, slots].permute(1, 0, 2).unsqueeze(0)
