"""The base of every CPU algorithm model: a `Candidate` of kind "model" that computes into
the harness-owned buffers and records the HBM bytes its loops moved.

The steps a kernel engineer can get wrong are methods: here the softmax scale, the K/V head
of a query head, the causal alignment, which tiles exist and the mask; in the algorithm
classes the online-softmax update, the final normalisation and the split combine. A
planted-bug model (harness.candidates.models.planted) overrides exactly one of them.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import torch

from harness.candidates.models import tiles as T
from harness.core.candidate import Candidate, Kind, Support
from harness.core.cases import Case, Inputs, MaskKind


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
        if out.shape != (case.batch, case.heads, case.seqlen_q, case.head_dim):
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

    # --- helpers built on those steps ---------------------------------------------------

    def key_end(self, case: Case, row_stop: int) -> int:
        """Keys past this end are invisible to every row before `row_stop`: tiles that start
        there are skipped (causal tile skipping)."""
        if case.mask.is_causal:
            return T.causal_key_end(case, self.causal_offset(case), row_stop)
        return case.seqlen_k

    def scores(self, case: Case, inputs: Inputs, q: torch.Tensor, k: torch.Tensor,
               rows: tuple[int, int], cols: tuple[int, int], counter: T.ByteCounter,
               ) -> torch.Tensor:
        """Scaled, masked float32 scores of one tile: (B, H, rows, cols)."""
        s = torch.matmul(q, k.transpose(-1, -2)) * self.softmax_scale(case)
        use_mask = self.uses_mask_tensor(case)
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
