"""Planted bugs of the serving case kinds (varlen batches, paged caches, sliding windows).

Like harness.candidates.models.planted, each is a correct model with one mistake, made in
exactly one overridden step; on dense cases without a window most of them are the
correct model. tests/test_planted_serving.py holds each to the case that exposes it and
proves the `serving` grid (harness.core.grids) fails every one of them.

Where the mistake would make a kernel read or write past the end of a tensor (a table
entry after the last one, a store past the last packed row), the model clips at the end
of the tensor: the GPU's out-of-bounds access has no CPU equivalent, and what stays is
the wrong data inside the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.candidates.models import tiles as T
from harness.candidates.models.fa2 import FA2Model
from harness.candidates.models.sequences import SeqView
from harness.candidates.models.splitkv import SplitKVModel, split_chunks
from harness.core.cases import Case, Inputs


@dataclass
class PageOffByOne(SplitKVModel):
    """Block-table lookup one entry too far (block_table[b * stride + p + 1]): every key
    tile reads the next logical page's keys, and the last page of a full row reads the
    next sequence's first page."""

    name: str = "bug_paged_page_off_by_one"

    def page_ids(self, seq: SeqView, logical: torch.Tensor) -> torch.Tensor:
        flat = seq.table.flatten()
        index = seq.b * seq.table.shape[1] + logical + 1
        return flat[index.clamp(max=flat.numel() - 1)]


@dataclass
class BlockTableIgnored(SplitKVModel):
    """The block table ignored: logical page p read from pool page p, as if the cache
    were contiguous (the pool is shuffled and shared, so nearly every key is wrong)."""

    name: str = "bug_paged_table_ignored"

    def page_ids(self, seq: SeqView, logical: torch.Tensor) -> torch.Tensor:
        return logical


@dataclass
class KeysPastSequenceEnd(FA2Model):
    """The last K/V tile of a sequence not clipped to seqlens_k[b]: a whole tile of
    block_k keys is read and attended, so a packed sequence sees the padding after it and
    the next sequence's first keys (dense cases are unaffected: the tile ends with K)."""

    name: str = "bug_varlen_keys_past_end"

    def key_tiles(self, case: Case) -> list[tuple[int, int]]:
        return [(c0, c0 + self.block_k) for c0 in range(0, case.seqlen_k, self.block_k)]


@dataclass
class PaddingRowsWritten(FA2Model):
    """The output store of a sequence's last Q block not predicated on seqlens_q[b]: all
    block_q rows are stored, the rows past the sequence (padding between packed
    sequences) get the block's unused zero rows."""

    name: str = "bug_varlen_padding_written"

    def store_rows(self, seq: SeqView | None, out: torch.Tensor, lse: torch.Tensor | None,
                   r0: int, o: torch.Tensor, blk_lse: torch.Tensor,
                   counter: T.ByteCounter) -> None:
        if seq is not None and not seq.paged:
            rows = min(self.block_q, seq.rows(out).shape[2] - r0)  # the tensor's end
            extra = rows - o.shape[2]
            if extra > 0:
                o = torch.cat([o, o.new_zeros(*o.shape[:2], extra, o.shape[3])], dim=2)
                blk_lse = torch.cat([blk_lse, blk_lse.new_zeros(*blk_lse.shape[:2], extra)],
                                    dim=2)
        super().store_rows(seq, out, lse, r0, o, blk_lse, counter)


@dataclass
class WindowLeftOffByOne(FA2Model):
    """Window's left edge tested j > i + o - left instead of >=: every row loses its
    leftmost window key (a window of (0, 0) sees nothing)."""

    name: str = "bug_window_left_off_by_one"

    def window_sides(self, case: Case) -> tuple[int | None, int | None]:
        left, right = super().window_sides(case)
        return (None if left is None else left - 1), right


@dataclass
class WindowRightOffByOne(FA2Model):
    """Window's right edge tested j < i + o + right instead of <=: every row loses its
    rightmost window key (under a causal mask with right = 0, the diagonal)."""

    name: str = "bug_window_right_off_by_one"

    def window_sides(self, case: Case) -> tuple[int | None, int | None]:
        left, right = super().window_sides(case)
        return left, (None if right is None else right - 1)


@dataclass
class WindowAlignSwapped(FA2Model):
    """Window aligned top-left where it is bottom-right and the other way round (the
    causal mask keeps its right alignment): identical when Nq == Nk, wrong otherwise."""

    name: str = "bug_window_align_swapped"

    def window_offset(self, case: Case) -> int:
        return case.seqlen_k - case.seqlen_q if case.window_top_left else 0


@dataclass
class SplitDropsLastPartialPage(SplitKVModel):
    """Split-KV over a paged cache that divides whole pages among the splits
    (floor(seqlens_k / page_size) of them): the keys of a sequence's last, partial page
    are in no split."""

    name: str = "bug_splitkv_last_page_dropped"
    num_splits: int = 3

    def split_key_tiles(self, case: Case, inputs: Inputs, splits: int,
                        ) -> list[list[tuple[int, int]]]:
        seq = inputs.serving
        tiles = self.key_tiles(case)
        if isinstance(seq, SeqView) and seq.paged:
            end = seq.k_len // seq.page_size * seq.page_size
            tiles = [(c0, min(c1, end)) for c0, c1 in tiles if c0 < end]
        return split_chunks(tiles, splits)


PLANTED_SERVING = (PageOffByOne, BlockTableIgnored, KeysPastSequenceEnd, PaddingRowsWritten,
                   WindowLeftOffByOne, WindowRightOffByOne, WindowAlignSwapped,
                   SplitDropsLastPartialPage)


def planted_serving_bugs() -> list[FA2Model]:
    """One fresh instance of every serving planted-bug model."""
    return [cls(description=" ".join((cls.__doc__ or "").split())) for cls in PLANTED_SERVING]
