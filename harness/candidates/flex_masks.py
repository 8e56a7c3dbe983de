"""The masks flex_attention is given (harness.candidates.flex): every mask kind of the
grids, sliding windows and the varlen layout as `mask_mod`s, and their block masks.

Written from the rule in harness.core.serving's module doc, not from its code: the tests
compare `create_mask` of these mask_mods with the oracle's masks, which only means
something if the two are written independently.

- Dense: causal (either alignment) is `kv <= q + offset`; a window is a band
  `q + o - left <= kv <= q + o + right` (o = 0 under causal_tl, else Nk - Nq), with the
  causal limit folded into its right edge; key padding and random masks are and-ed on.
- Varlen: flex's document masking over the packed (1, H, Tq, d) / (1, Hkv, Tk, d)
  tensors. Every packed row gets its sequence (padding rows: -1 for queries, -2 for keys,
  so they never meet) and every query row its position shifted by its sequence's offset
  o; a query row sees a key of its own sequence, within that sequence's length, inside the
  band. A padding row sees nothing. With `compact`, the query rows are the sequences'
  rows alone, back to back (flex then runs on q gathered by `sequence_rows`: module doc of
  harness.candidates.flex says why).

Every number a mask_mod reads is a captured tensor, never a Python int: dynamo guards on
a closure's ints, so each new offset or window of a grid would compile the kernel again.
An unbounded window side is the bound UNBOUNDED, which no index reaches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

UNBOUNDED = 1 << 40  # a window edge beyond every index: that side is unbounded


@dataclass(frozen=True)
class MaskKey:
    """Everything that changes a block mask built from the shape alone: the device, the
    tensors' (B, Nq, Nk) as flex sees them, the mask kind and causal offset, the window,
    and the layout with its placement (slot starts and lengths of every sequence)."""

    device: str
    shape: tuple[int, int, int]
    mask_kind: str
    causal_offset: int
    window: tuple[int, int]
    layout: str
    placement: tuple[tuple[int, ...], ...] = ()
    compact: bool = False


# The block mask of the latest case whose mask depends on its shape alone (not on drawn
# tensors): the timing loop prepares one call per input set, and those sets share it.
_cache: dict[MaskKey, Any] = {}


def _scalar(x: int, device: torch.device | str) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int64, device=device)


def _band_edges(mask_kind: str, window: tuple[int, int], device: torch.device | str
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(left, right) extents of the band around the aligned diagonal: the window's, the
    causal limit folded into the right one, UNBOUNDED for an unbounded side."""
    left, right = window
    right = UNBOUNDED if right < 0 else right
    if mask_kind in ("causal_br", "causal_tl"):
        right = min(right, 0)
    return (_scalar(UNBOUNDED if left < 0 else left, device), _scalar(right, device))


def dense_mask_mod(mask_kind: str, mask: torch.Tensor | None,
                   key_lengths: torch.Tensor | None, causal_offset: int,
                   window: tuple[int, int], nq: int, nk: int,
                   device: torch.device | str = "cpu") -> Any | None:
    """The mask_mod of a dense (B, H, Nq, Nk) case, or None when every key is visible."""
    from torch.nn.attention.flex_attention import and_masks

    mods = []
    if window[0] >= 0 or window[1] >= 0:
        left, right = _band_edges(mask_kind, window, device)
        off = _scalar(0 if mask_kind == "causal_tl" else nk - nq, device)

        def band(b, h, q_idx, kv_idx):
            i = q_idx + off
            return (kv_idx >= i - left) & (kv_idx <= i + right)

        mods.append(band)
    elif mask_kind in ("causal_br", "causal_tl"):
        off = _scalar(causal_offset, device)

        def causal(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + off

        mods.append(causal)
    if mask_kind == "key_padding":
        assert key_lengths is not None
        lengths = key_lengths.to(device=device, dtype=torch.int64)

        def padding(b, h, q_idx, kv_idx):
            return kv_idx < lengths[b]

        mods.append(padding)
    if mask_kind == "random":
        assert mask is not None
        dense = mask[:, 0].to(device)  # (B|1, Nq, Nk)
        per_batch = dense.shape[0] != 1

        def random(b, h, q_idx, kv_idx):
            return dense[b if per_batch else 0, q_idx, kv_idx]

        mods.append(random)
    if not mods:
        return None
    return mods[0] if len(mods) == 1 else and_masks(*mods)


@dataclass(frozen=True)
class Packing:
    """Per packed row: the sequence it belongs to and its position (varlen)."""

    q_seq: torch.Tensor  # (Tq,) int64: sequence, -1 for a padding row
    q_shift: torch.Tensor  # (Tq,) int64: position in the sequence + its offset o
    k_seq: torch.Tensor  # (Tk,) int64: sequence, -2 for a padding row
    k_pos: torch.Tensor  # (Tk,) int64: position in the sequence


def placement_of(serving: Any) -> tuple[tuple[int, ...], ...]:
    """(cu_seqlens_q, seqlens_q, cu_seqlens_k, seqlens_k) of a varlen ServingIndex as
    Python ints (read once, in the preparation)."""
    return tuple(tuple(int(x) for x in t.tolist()) for t in
                 (serving.cu_seqlens_q, serving.seqlens_q, serving.cu_seqlens_k,
                  serving.seqlens_k))


def sequence_rows(placement: tuple[tuple[int, ...], ...]) -> list[int]:
    """The packed query rows that belong to a sequence, in order (the others are
    padding)."""
    cu_q, len_q = placement[0], placement[1]
    return [cu_q[b] + i for b, n in enumerate(len_q) for i in range(n)]


def packing(placement: tuple[tuple[int, ...], ...], total_q: int, total_k: int,
            top_left: bool, device: torch.device | str, compact: bool = False) -> Packing:
    """The per-row tensors of a varlen case; `compact`: query rows without the padding
    (sequence b's rows start after the rows of the sequences before it)."""
    cu_q, len_q, cu_k, len_k = placement
    if compact:
        cu_q = tuple(sum(len_q[:b]) for b in range(len(len_q)))
        total_q = sum(len_q)
    q_seq = torch.full((total_q,), -1, dtype=torch.int64)
    q_shift = torch.zeros(total_q, dtype=torch.int64)
    k_seq = torch.full((total_k,), -2, dtype=torch.int64)
    k_pos = torch.zeros(total_k, dtype=torch.int64)
    for b, (nq, nk) in enumerate(zip(len_q, len_k, strict=True)):
        o = 0 if top_left else nk - nq
        q_seq[cu_q[b]:cu_q[b] + nq] = b
        q_shift[cu_q[b]:cu_q[b] + nq] = torch.arange(nq) + o
        k_seq[cu_k[b]:cu_k[b] + nk] = b
        k_pos[cu_k[b]:cu_k[b] + nk] = torch.arange(nk)
    return Packing(*(t.to(device) for t in (q_seq, q_shift, k_seq, k_pos)))


def varlen_mask_mod(mask_kind: str, window: tuple[int, int], pack: Packing,
                    device: torch.device | str = "cpu") -> Any:
    """The document mask of a varlen case (module doc)."""
    left, right = _band_edges(mask_kind, window, device)
    q_seq, q_shift, k_seq, k_pos = pack.q_seq, pack.q_shift, pack.k_seq, pack.k_pos

    def document(b, h, q_idx, kv_idx):
        i, j = q_shift[q_idx], k_pos[kv_idx]
        return (q_seq[q_idx] == k_seq[kv_idx]) & (j >= i - left) & (j <= i + right)

    return document


def block_mask_for(q: torch.Tensor, k: torch.Tensor, *, mask_kind: str,
                   mask: torch.Tensor | None, key_lengths: torch.Tensor | None,
                   causal_offset: int, window: tuple[int, int] = (-1, -1),
                   layout: str = "dense", serving: Any = None, compact: bool = False
                   ) -> Any | None:
    """The BlockMask of a case (None when nothing is masked); varlen with `compact`: over
    the sequences' query rows alone. Masks that depend on the shape and placement alone
    are kept for the next preparation with the same MaskKey; key padding and random masks
    come from the drawn tensors and are built every time."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, _, Nq, _ = q.shape
    Nk = k.shape[2]
    placement = placement_of(serving) if layout == "varlen" else ()
    compact = compact and layout == "varlen"
    if compact:
        Nq = sum(placement[1])
    key = MaskKey(str(q.device), (B, Nq, Nk), mask_kind, causal_offset, tuple(window),
                  layout, placement, compact)
    if key in _cache:
        return _cache[key]
    if layout == "varlen":
        pack = packing(placement, Nq, Nk, mask_kind == "causal_tl", q.device, compact)
        mod = varlen_mask_mod(mask_kind, window, pack, q.device)
    else:
        mod = dense_mask_mod(mask_kind, mask, key_lengths, causal_offset, window, Nq, Nk,
                             q.device)
    block_mask = None if mod is None else create_block_mask(mod, B, None, Nq, Nk,
                                                            device=q.device)
    if mask_kind not in ("key_padding", "random"):
        _cache.clear()  # one case at a time: the cache never holds more than one mask
        _cache[key] = block_mask
    return block_mask
