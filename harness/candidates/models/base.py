"""The base of every CPU algorithm model: a `Candidate` of kind "model" that computes into
the harness-owned buffers and records the HBM bytes its loops moved.

The steps a kernel engineer can get wrong are methods: here the softmax scale, the K/V head
of a query head, the causal alignment, which tiles exist and the mask, the sliding
window's sides and alignment, S = QK^T's precision, the loop bounds over the head dims
(d_qk for QK^T, d_v for PV), the score modifiers (softcap, the ALiBi bias and its
alignment), the K/V tile load (a page lookup per key tile for paged
caches), the dequantization of FP8 tiles (`dequant`: e4m3 values times their descales,
harness.core.fp8) and the store of a row block; in the algorithm classes the online-softmax update,
the final normalisation and the split combine. A planted-bug model
(harness.candidates.models.planted, planted_serving) overrides exactly one of them.

Sliding windows (dense or per sequence) use each row's key interval [lo, hi) from the
causal offset and the window's sides (`row_intervals`): key tiles outside the union of a
row block's intervals are skipped, the others masked. Without a window the causal path
is the one the models always had (whole-tile skipping past the diagonal).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import torch

from harness.candidates.models import tiles as T
from harness.candidates.models.sequences import SeqView, gather_keys
from harness.core.candidate import Candidate, Kind, Support
from harness.core.cases import Case, Fp8, Inputs, MaskKind
from harness.core.serving import tensor_shapes


@dataclass
class ModelCandidate(Candidate):
    name: str = ""
    kind: Kind = "model"
    device: Literal["cpu", "cuda"] = "cpu"
    support: Support = field(default_factory=lambda: Support(masked_lse="-inf"))
    block_q: int = 64
    block_k: int = 64
    # Value a masked score gets. -inf is right; a finite fill turns a fully masked row into
    # the mean of V instead of 0 (a planted bug overrides it).
    mask_fill: float = field(default=T.NEG_INF, repr=False)
    # Bytes moved by the last `run` (None before the first one).
    last_bytes: T.ByteCounter | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.block_q < 1 or self.block_k < 1:
            raise ValueError(f"{self.name}: block sizes must be >= 1")
        self.tiles = {"block_q": self.block_q, "block_k": self.block_k, **self.tiles}

    def run(self, case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None) -> None:
        want = tensor_shapes(case)["out"] if case.is_serving else (
            case.batch, case.heads, case.seqlen_q, case.dv)
        if tuple(out.shape) != tuple(want):
            raise ValueError(f"{self.name}: out has shape {tuple(out.shape)}, case {case.id}")
        counter = T.ByteCounter()
        with torch.no_grad(), _one_intra_op_thread():
            self.compute(case, inputs.to("cpu"), out, lse, counter)
        self.last_bytes = counter

    @abstractmethod
    def compute(self, case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None,
                counter: T.ByteCounter) -> None:
        """The algorithm: fill `out` (and `lse`), counting HBM traffic in `counter`."""

    # --- the steps a planted bug may override -------------------------------------------

    def softmax_scale(self, case: Case) -> float:
        return T.softmax_scale(case)

    def kv_heads(self, case: Case) -> torch.Tensor:
        return T.kv_head_map(case)

    def causal_offset(self, case: Case) -> int:
        """Query i sees key j iff j <= i + offset (causal cases only)."""
        return case.causal_offset

    def uses_mask_tensor(self, case: Case) -> bool:
        return True

    def query_tiles(self, case: Case) -> list[tuple[int, int]]:
        return T.tile_ranges(case.seqlen_q, self.block_q)

    def key_tiles(self, case: Case) -> list[tuple[int, int]]:
        return T.tile_ranges(case.seqlen_k, self.block_k)

    def window_sides(self, case: Case) -> tuple[int | None, int | None]:
        """(left, right) extents of the sliding window in keys; None: unbounded."""
        return (case.window_left if case.window_left >= 0 else None,
                case.window_right if case.window_right >= 0 else None)

    def window_offset(self, case: Case) -> int:
        """The window's alignment offset o (row i's window is centred on key i + o):
        top-left (0) under CAUSAL_TL, else bottom-right (Nk - Nq), per sequence."""
        return 0 if case.window_top_left else case.seqlen_k - case.seqlen_q

    def qk_dim(self, case: Case) -> int:
        """The length of QK^T's dot products: d_qk."""
        return case.head_dim

    def v_dim(self, case: Case) -> int:
        """The columns of V the PV product (and O's store) runs over: d_v."""
        return case.dv

    def qk(self, case: Case, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """S = Q K^T of a tile over d_qk, unscaled, kept in float32 (as in registers)."""
        d = self.qk_dim(case)
        return torch.matmul(q[..., :d], k[..., :d].transpose(-1, -2))

    def cap(self, case: Case, s: torch.Tensor) -> torch.Tensor:
        """Logit soft-capping c * tanh(s / c) of a tile's scaled scores (no softcap: s)."""
        return case.softcap * torch.tanh(s / case.softcap) if case.softcap else s

    def alibi_offset(self, case: Case) -> int:
        """ALiBi's alignment: row i sits at key position i + o (the window's o)."""
        return case.diagonal_offset

    def alibi_bias(self, case: Case, inputs: Inputs, rows: tuple[int, int],
                   cols: tuple[int, int]) -> torch.Tensor | None:
        """-slope_h * |i + o - j| over a tile: (1, H, rows, cols) float32, None without
        ALiBi."""
        if not case.alibi or inputs.alibi_slopes is None:
            return None
        i = torch.arange(*rows)[:, None] + self.alibi_offset(case)
        j = torch.arange(*cols)[None, :]
        slopes = inputs.alibi_slopes.float()[None, :, None, None]
        return -slopes * (i - j).abs().float()[None, None]

    def dequant(self, x: torch.Tensor, descale: torch.Tensor | None) -> torch.Tensor:
        """An fp8 tile's values: its float32 elements times their descales (rows of
        `descale` matching x's, harness.core.fp8); a tile without descales as it is."""
        return x if descale is None else x * descale[..., None]

    def load_q(self, case: Case, inputs: Inputs, r0: int, r1: int) -> torch.Tensor:
        """Q rows [r0, r1) as float32 (B, H, n, d), dequantized when e4m3."""
        return self.dequant(T.load_tile(inputs.q, None, r0, r1),
                            T.scale_rows(inputs.q_descale, None, r0, r1))

    def page_ids(self, seq: SeqView, logical: torch.Tensor) -> torch.Tensor:
        """Pool page of each logical page index of sequence `seq`: its block-table row."""
        return seq.table[seq.b, logical]

    def slot_descales(self, seq: SeqView, descale: torch.Tensor, logical: torch.Tensor,
                      slots: torch.Tensor) -> torch.Tensor:
        """The per-token descales (1, Hkv, n) of a paged cache's keys at logical pages
        `logical`, slots `slots`: looked up through the block table like the keys."""
        return descale[self.page_ids(seq, logical), :, slots].t().unsqueeze(0)

    def load_kv(self, case: Case, inputs: Inputs, heads: torch.Tensor, c0: int, c1: int,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V tiles of keys [c0, c1) as float32 (B|1, H, n, d): dense rows, a packed
        sequence's keys from its first key on, or a paged one's through the block table
        (one table lookup per key of the tile). n < c1 - c0 only where the tensor ends."""
        seq = inputs.serving
        if not isinstance(seq, SeqView) or not seq.paged:
            r0 = seq.k_row if isinstance(seq, SeqView) else 0
            r0, r1 = r0 + c0, r0 + c1
            k = self.dequant(T.load_tile(inputs.k, heads, r0, r1),
                             T.scale_rows(inputs.k_descale, heads, r0, r1))
            v = self.dequant(T.load_tile(inputs.v, heads, r0, r1),
                             T.scale_rows(inputs.v_descale, heads, r0, r1))
            return k, v
        ps = seq.page_size
        j = torch.arange(c0, min(c1, seq.table.shape[1] * ps))
        logical, slots = j // ps, j % ps
        pages = self.page_ids(seq, logical)

        def load(pool: torch.Tensor, descale: torch.Tensor | None) -> torch.Tensor:
            tile = gather_keys(pool, pages, slots).index_select(1, heads).float()
            if descale is not None and case.fp8 is Fp8.KV_TOKEN:  # per slot: gathered too
                descale = self.slot_descales(seq, descale, logical, slots)
            return self.dequant(tile, T.scale_rows(descale, heads, 0, tile.shape[2]))

        return load(inputs.k, inputs.k_descale), load(inputs.v, inputs.v_descale)

    def store_rows(self, seq: SeqView | None, out: torch.Tensor, lse: torch.Tensor | None,
                   r0: int, o: torch.Tensor, blk_lse: torch.Tensor,
                   counter: T.ByteCounter) -> None:
        """Write a block of rows from row r0 on (of every batch entry when `seq` is None,
        else of that sequence, and only its rows; the columns O has) and count the bytes
        written."""
        n = o.shape[2]
        dst = out if seq is None else seq.rows(out)
        dst[:, :, r0:r0 + n, :o.shape[3]] = o.to(out.dtype)
        counter.write("O", o.numel() * out.element_size())
        if lse is not None:
            dst_lse = lse if seq is None else seq.rows(lse)
            dst_lse[:, :, r0:r0 + n] = blk_lse
            counter.write("LSE", blk_lse.numel() * T.F32_BYTES)

    # --- helpers built on those steps ---------------------------------------------------

    def key_end(self, case: Case, row_stop: int) -> int:
        """Keys past this end are invisible to every row before `row_stop`: tiles that start
        there are skipped (causal tile skipping)."""
        if case.mask.is_causal:
            return T.causal_key_end(case, self.causal_offset(case), row_stop)
        return case.seqlen_k

    def row_intervals(self, case: Case, r0: int, r1: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[lo, hi) of the keys each row of [r0, r1) sees under the causal mask and the
        window (int64; hi <= lo for a row that sees nothing)."""
        i = torch.arange(r0, r1, dtype=torch.int64)
        lo = torch.zeros_like(i)
        hi = torch.full_like(i, case.seqlen_k)
        if case.mask.is_causal:
            hi = torch.minimum(hi, i + self.causal_offset(case) + 1)
        left, right = self.window_sides(case)
        o = self.window_offset(case)
        if right is not None:
            hi = torch.minimum(hi, i + o + right + 1)
        if left is not None:
            lo = torch.maximum(lo, i + o - left)
        return lo, hi

    def key_span(self, case: Case, rows: tuple[int, int]) -> tuple[int, int]:
        """[start, end) of the keys some row of the block sees: key tiles wholly outside
        are skipped. Without a window, the causal end (or every key)."""
        if not case.has_window:
            return 0, self.key_end(case, rows[1])
        lo, hi = self.row_intervals(case, *rows)
        seen = hi > lo
        if not bool(seen.any()):
            return 0, 0
        return int(lo[seen].min()), int(hi[seen].max())

    def scores(self, case: Case, inputs: Inputs, q: torch.Tensor, k: torch.Tensor,
               rows: tuple[int, int], cols: tuple[int, int], counter: T.ByteCounter,
               ) -> torch.Tensor:
        """Scaled, soft-capped, ALiBi-biased, masked float32 scores of one tile:
        (B, H, rows, cols)."""
        s = self.cap(case, self.qk(case, q, k) * self.softmax_scale(case))
        bias = self.alibi_bias(case, inputs, rows, (cols[0], cols[0] + s.shape[-1]))
        if bias is not None:
            s = s + bias
        use_mask = self.uses_mask_tensor(case)
        if case.has_window:
            lo, hi = self.row_intervals(case, *rows)
            vis = T.interval_visibility(lo, hi, cols)
            if use_mask and inputs.mask is not None:
                vis = vis & T.mask_tile(inputs.mask, rows, cols)
        else:
            vis = T.tile_visibility(case, inputs, rows, cols, self.causal_offset(case),
                                    use_mask=use_mask)
        if use_mask and inputs.mask is not None and case.mask is MaskKind.RANDOM:
            # An arbitrary mask is a tensor in HBM; each (b, h) program reads its tile.
            counter.read("mask", T.tile_bytes(case, rows[1] - rows[0], cols[1] - cols[0], 1))
        if vis is not None:
            s = s.masked_fill(~vis, self.mask_fill)
        return s


@contextmanager
def _one_intra_op_thread() -> Iterator[None]:
    """Run the tile loop on one intra-op thread. The per-tile ops are small, so threads
    bring little even on an idle machine, and on a busy 2-core runner (pytest-xdist, other
    jobs) torch's spinning workers made the models 30-60x slower in measurements."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
