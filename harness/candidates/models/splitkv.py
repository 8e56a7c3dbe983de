"""Split-KV (flash-decoding) forward on the CPU, and the split-count heuristic.

The K/V blocks are divided into `splits` contiguous chunks of ceil(blocks / splits)
blocks. For every chunk and Q block, a program runs the FA2 inner loop over its chunk
only and writes a float32 partial O (normalised by its own l) and a partial LSE: -inf when
the chunk holds no visible key for the row (an empty split, including the trailing chunks
when splits exceed the blocks). A combine step then reads all partials back:
    lse = logsumexp_s(lse_s),  O = sum_s exp(lse_s - lse) * O_s,
with every non-finite scale (exp(-inf - -inf) = NaN on a fully masked row) replaced by 0.
One split is plain FA2 (no partials, no combine). A sink (harness.core.reference's doc)
joins the combine once, as one more split with partial O = 0 and partial LSE = the sink
logit; the splits' own partials never see it. Partial O rows are d_v wide. FP8 inputs
and KV caches are dequantized tile by tile as in the FA2 model.

Serving cases (varlen decode batches, paged caches) run per sequence like the FA2 model
(harness.candidates.models.fa2), with the case's one split count: each sequence's own
key tiles are divided into the splits, read through the block table when paged, and the
combine stores only that sequence's rows.

`num_splits`: 1 = no split, > 1 = that many, 0 = `choose_num_splits` per case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from harness.candidates.models import tiles as T
from harness.candidates.models.fa2 import FA2Model
from harness.candidates.models.sequences import SeqView
from harness.core.candidate import Support
from harness.core.cases import Case, Inputs, Layout

# Streaming multiprocessors assumed by the heuristic on the CPU (H100/H200 SXM have 132).
DEFAULT_SM_COUNT = 132
# Keys per split granule the heuristic counts in when the caller does not say.
DEFAULT_SPLIT_BLOCK_K = 64


def choose_num_splits(batch: int, heads: int, seqlen_q: int, seqlen_k: int, block_q: int,
                      sm_count: int, max_splits: int = 128, *,
                      block_k: int = DEFAULT_SPLIT_BLOCK_K) -> int:
    """Split count in the spirit of FlashAttention-2's heuristic.

    No split when the unsplit grid (batch * heads * Q blocks programs) already fills 80% of
    the SMs. Otherwise, among split counts up to min(max_splits, sm_count, K blocks), keep
    those that change the blocks per split (ceil(blocks / s) differs from s - 1's: others
    only add empty splits), measure each one's wave efficiency (waves / ceil(waves)), and
    return the smallest that reaches 85% of the best: fewer splits mean less combine work.
    """
    for name, value in (("batch", batch), ("heads", heads), ("seqlen_q", seqlen_q),
                        ("seqlen_k", seqlen_k), ("block_q", block_q), ("sm_count", sm_count),
                        ("max_splits", max_splits), ("block_k", block_k)):
        if int(value) < 1:
            raise ValueError(f"choose_num_splits: {name} must be >= 1, got {value}")
    programs = batch * heads * math.ceil(seqlen_q / block_q)
    if programs >= 0.8 * sm_count:
        return 1
    n_blocks = math.ceil(seqlen_k / block_k)
    limit = min(max_splits, sm_count, n_blocks)

    def eligible(s: int) -> bool:
        return s == 1 or math.ceil(n_blocks / s) != math.ceil(n_blocks / (s - 1))

    efficiency: dict[int, float] = {}
    for s in range(1, limit + 1):
        if eligible(s):
            waves = programs * s / sm_count
            efficiency[s] = waves / math.ceil(waves)
    best = max(efficiency.values())
    return min(s for s, eff in efficiency.items() if eff >= 0.85 * best)


def split_chunks(key_tiles: list[tuple[int, int]], splits: int) -> list[list[tuple[int, int]]]:
    """Contiguous chunks of ceil(len / splits) K/V tiles, one per split (maybe empty)."""
    per = max(1, math.ceil(len(key_tiles) / splits))
    return [key_tiles[s * per:(s + 1) * per] for s in range(splits)]


@dataclass
class SplitKVModel(FA2Model):
    name: str = "splitkv_model"
    algorithm: str = "splitkv"
    description: str = ("split-KV (flash-decoding) on the CPU: partial O/LSE per split, "
                        "combine; varlen and paged caches, sliding windows")
    support: Support = field(default_factory=lambda: Support(
        masked_lse="-inf", backward=True, backward_deterministic=True,
        layouts=frozenset(Layout), window=True, softcap=True, alibi=True, sinks=True,
        head_dim_v=True, fp8=True, fp8_kv=True))
    num_splits: int = 0
    sm_count: int = DEFAULT_SM_COUNT
    # Split count the last run used (num_splits, or the heuristic's choice).
    last_splits: int | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_splits < 0:
            raise ValueError(f"{self.name}: num_splits must be >= 0 (0 = heuristic)")
        self.tiles = {**self.tiles, "num_splits": self.num_splits}
        if self.num_splits > 0:
            self.tiles["splits"] = self.num_splits

    def resolve_splits(self, case: Case) -> int:
        if self.num_splits > 0:
            return self.num_splits
        return choose_num_splits(case.batch, case.heads, case.seqlen_q, case.seqlen_k,
                                 self.block_q, self.sm_count, block_k=self.block_k)

    def tiles_for(self, case: Case) -> dict[str, int]:
        """Tile sizes with the split count resolved for `case` (what the IO model needs
        when the count comes from the heuristic)."""
        return {**self.tiles, "splits": self.resolve_splits(case)}

    def compute(self, case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None,
                counter: T.ByteCounter) -> None:
        # One split count for the whole case (a serving batch's sequences share the grid).
        self.last_splits = self.resolve_splits(case)
        super().compute(case, inputs, out, lse, counter)

    def attend(self, case: Case, inputs: Inputs, seq: SeqView | None, out: torch.Tensor,
               lse: torch.Tensor | None, counter: T.ByteCounter) -> None:
        splits = self.last_splits or 1
        if splits == 1:
            super().attend(case, inputs, seq, out, lse, counter)
            return
        d = case.dv  # the partial O rows are d_v wide
        b, h, nq = case.batch, case.heads, case.seqlen_q
        self.read_descales(case, counter)
        o_part = torch.zeros(b, h, splits, nq, d)
        lse_part = torch.full((b, h, splits, nq), T.NEG_INF)
        sink = None if inputs.sinks is None else inputs.sinks.float()[None, :, None]
        for s, chunk in enumerate(self.split_key_tiles(case, inputs, splits)):
            for r0, r1 in self.query_tiles(case):
                o, m, lsum = self.attend_rows(case, inputs, (r0, r1), chunk, counter)
                o, part_lse = self.finish_split(o, m, lsum, sink)
                o_part[:, :, s, r0:r1] = o
                lse_part[:, :, s, r0:r1] = part_lse
                counter.write("O_partial", T.tile_bytes(case, r1 - r0, d, T.F32_BYTES))
                counter.write("LSE_partial", T.tile_bytes(case, r1 - r0, 1, T.F32_BYTES))
        counter.read("LSE_partial", b * h * splits * nq * T.F32_BYTES)
        counter.read("O_partial", b * h * splits * nq * d * T.F32_BYTES)
        o, total_lse = self.combine(*self.with_sink(o_part, lse_part, sink))
        self.store_rows(seq, out, lse, 0, o, total_lse, counter)

    def finish_split(self, o: torch.Tensor, m: torch.Tensor, lsum: torch.Tensor,
                     sink: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """A split's partial O and LSE: over its own keys only (the sink is the
        combine's)."""
        return self.finish(o, m, lsum)

    @staticmethod
    def with_sink(o_part: torch.Tensor, lse_part: torch.Tensor, sink: torch.Tensor | None,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The partials with the sink (1, H, 1) as one more split, once: partial O 0 and
        partial LSE the sink logit, so the combine's LSE includes it and weighs the
        splits' O by exp(lse_s - lse)."""
        if sink is None:
            return o_part, lse_part
        b, h, _, nq = lse_part.shape
        z = sink[..., None].expand(b, h, 1, nq)
        return (torch.cat((o_part, o_part.new_zeros(b, h, 1, nq, o_part.shape[-1])), dim=2),
                torch.cat((lse_part, z), dim=2))

    def split_key_tiles(self, case: Case, inputs: Inputs, splits: int,
                        ) -> list[list[tuple[int, int]]]:
        """The K/V tiles of each split (of the sequence's own keys for a serving case)."""
        return split_chunks(self.key_tiles(case), splits)

    @staticmethod
    def combine(o_part: torch.Tensor, lse_part: torch.Tensor,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, H, S, Nq, d) partial O and (B, H, S, Nq) partial LSE -> O, LSE."""
        return combine_splits(o_part, lse_part, dim=2)


def combine_splits(o_part: torch.Tensor, lse_part: torch.Tensor, *, dim: int = 0,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge per-split partial outputs along `dim` (lse_part has no trailing head_dim).

    lse = logsumexp over splits (-inf when every split is empty), each split weighted by
    exp(lse_s - lse); a non-finite weight (NaN from -inf - -inf) becomes 0, so a fully
    masked row ends at O = 0, LSE = -inf."""
    top = lse_part.amax(dim=dim, keepdim=True)
    top = torch.where(torch.isneginf(top), 0.0, top)
    lse = torch.log(torch.exp(lse_part - top).sum(dim=dim, keepdim=True)) + top
    scale = torch.exp(lse_part - lse)
    scale = torch.where(torch.isfinite(scale), scale, 0.0)
    o = (scale.unsqueeze(-1) * o_part).sum(dim=dim)
    return o, lse.squeeze(dim)
