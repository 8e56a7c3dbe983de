"""Pieces every CPU algorithm model shares: the byte counter, tile ranges, tile masks and
the head mapping.

The models run on the CPU in torch, one tile at a time, the way a kernel's loops would.
Each tile op is vectorised over batch and heads (one tile of every (b, h) program at once),
so a model costs Python overhead per tile, not per element or per head.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.core.cases import Case, Inputs
from harness.core.fp8 import scalar_descales, stored_bytes

# The score of a masked pair and the initial running max. Where a row's max is still -inf
# (every key so far masked), the models subtract 0 instead (the -inf guard), so that
# exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN.
NEG_INF = float("-inf")

# Element size of the float32 tensors kernels keep in HBM: LSE, FA1's m and l, the
# split-KV partial outputs and partial LSEs.
F32_BYTES = 4


@dataclass
class ByteCounter:
    """HBM bytes one model run moved, as its tile loops load and store them.

    Counted per tensor name ("Q", "K", "V", "O", "LSE", "S", "P", "m", "l", "O_partial",
    "LSE_partial", "mask"), so a test can hold each term against the IO model."""

    reads: dict[str, int] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)

    def read(self, what: str, nbytes: int) -> None:
        self.reads[what] = self.reads.get(what, 0) + int(nbytes)

    def write(self, what: str, nbytes: int) -> None:
        self.writes[what] = self.writes.get(what, 0) + int(nbytes)

    @property
    def read_bytes(self) -> int:
        return sum(self.reads.values())

    @property
    def write_bytes(self) -> int:
        return sum(self.writes.values())

    @property
    def total(self) -> int:
        return self.read_bytes + self.write_bytes

    def without(self, *names: str) -> int:
        """Total bytes leaving out the named tensors (e.g. "mask", which the IO model of an
        unmasked algorithm does not carry)."""
        return (sum(v for k, v in self.reads.items() if k not in names)
                + sum(v for k, v in self.writes.items() if k not in names))

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {"reads": dict(self.reads), "writes": dict(self.writes)}


def tile_ranges(n: int, block: int) -> list[tuple[int, int]]:
    """[start, stop) of each block of `n` rows; the last block may be partial."""
    return [(s, min(s + block, n)) for s in range(0, n, block)]


def softmax_scale(case: Case) -> float:
    return case.head_dim ** -0.5


def kv_head_map(case: Case) -> torch.Tensor:
    """K/V head read by each query head: h // group (GQA/MQA), as fa_harness.h defines."""
    return torch.arange(case.heads) // case.group_size


def causal_key_end(case: Case, offset: int, row_stop: int) -> int:
    """Exclusive end of the keys any row in [., row_stop) can see under a causal mask with
    `offset`: key tiles from there on are skipped whole, as kernels do."""
    return max(0, min(case.seqlen_k, row_stop - 1 + offset + 1))


def tile_visibility(case: Case, inputs: Inputs, rows: tuple[int, int], cols: tuple[int, int],
                    offset: int, *, use_mask: bool = True) -> torch.Tensor | None:
    """Boolean visibility of one (rows x cols) tile, shaped (B|1, 1, rows, cols), or None
    when the whole tile is visible. `offset` is the causal offset the model applies
    (query i sees key j iff j <= i + offset); `use_mask` False drops the mask tensor."""
    r0, r1 = rows
    c0, c1 = cols
    vis: torch.Tensor | None = None
    if case.mask.is_causal:
        i = torch.arange(r0, r1)[:, None]
        j = torch.arange(c0, c1)[None, :]
        if c1 - 1 > r0 + offset:  # some pair of the tile is above the diagonal
            vis = (j <= i + offset)[None, None]
    if use_mask and inputs.mask is not None:
        m = mask_tile(inputs.mask, rows, cols)
        vis = m if vis is None else (vis & m)
    return vis


def mask_tile(mask: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int]) -> torch.Tensor:
    """The (rows x cols) tile of a (B|1, 1, Nq|1, Nk) boolean mask tensor."""
    (r0, r1), (c0, c1) = rows, cols
    return mask[:, :, r0:r1, c0:c1] if mask.shape[2] != 1 else mask[:, :, :, c0:c1]


def interval_visibility(lo: torch.Tensor, hi: torch.Tensor, cols: tuple[int, int],
                        ) -> torch.Tensor:
    """(1, 1, rows, cols) visibility of a tile whose row r sees keys [lo[r], hi[r])."""
    j = torch.arange(cols[0], cols[1])[None, :]
    return ((j >= lo[:, None]) & (j < hi[:, None]))[None, None]


def load_tile(t: torch.Tensor, heads: torch.Tensor | None, r0: int, r1: int) -> torch.Tensor:
    """Rows [r0, r1) of a (B, H, N, d) tensor as float32 (what a kernel converts its tile
    to in registers), with the head dimension gathered through `heads` for K/V."""
    tile = t[:, :, r0:r1, :]
    if heads is not None:
        tile = tile.index_select(1, heads)
    return tile.to(torch.float32)


def tile_bytes(case: Case, rows: int, width: int, elem: int) -> int:
    """Bytes of one tile of `rows` x `width` elements loaded by every (b, h) program."""
    return case.batch * case.heads * rows * width * elem


def elem_size(case: Case) -> int:
    return torch.empty((), dtype=case.torch_dtype).element_size()


def scale_rows(descale: torch.Tensor | None, heads: torch.Tensor | None, r0: int, r1: int,
               ) -> torch.Tensor | None:
    """The float32 descales of rows [r0, r1) of an fp8 tensor (harness.core.fp8: shaped
    (B|1, H|1, N|1)), its heads gathered through `heads` like `load_tile`'s; None stays
    None (not an fp8 tensor)."""
    if descale is None:
        return None
    d = descale[:, :, r0:r1] if descale.shape[2] != 1 else descale
    if heads is not None and d.shape[1] != 1:
        d = d.index_select(1, heads)
    return d.to(torch.float32)



def input_sizes(case: Case) -> tuple[int, int, int]:
    """Bytes of an element of Q and of K/V as stored (1 for e4m3), and of the descale each
    K/V row carries of its own (4 for per-token scales, else 0): harness.core.fp8."""
    return stored_bytes(case)


def descale_bytes(case: Case) -> int:
    """Bytes of the per-tensor or per-head descales a problem's (b, h) programs read, once
    per (b, h) (harness.core.fp8.scalar_descales): the IO model's "read descales"."""
    return case.batch * case.heads * scalar_descales(case) * F32_BYTES
