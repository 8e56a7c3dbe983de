"""Serving layouts: packed variable-length batches, paged KV caches, sliding windows.

Every sequence b of a varlen or paged case is its own attention problem of
`q_lens[b]` query rows over `k_lens[b]` keys; `Case.seqlen_q` and `Case.seqlen_k` are the
largest lengths. Within a sequence, query row i sees key j (0 <= j < k_len) iff

    causal:        j <= i + o
    window left:   j >= i + o - window_left    (when window_left >= 0)
    window right:  j <= i + o + window_right   (when window_right >= 0)

with the alignment offset o = 0 under CAUSAL_TL and o = k_len - q_len otherwise (the
bottom-right alignment FlashAttention uses for causal masks and windows). A dense case
with a window uses the same rule with its Nq and Nk. A row that sees no key is fully
masked: out 0, lse -inf.

Memory layouts (the layout is the harness's, like the dense (B, H, N, d)):

- varlen: q (1, H, Tq, d), k and v (1, Hkv, Tk, d): the sequences packed along the row
  dimension, head-major like the dense layout and like flex_attention's document masking.
  Sequence b's rows start at `cu_seqlens_q[b]` and it has `seqlens_q[b]` of them; the slot
  runs to `cu_seqlens_q[b + 1]`, and the rows between (padding) belong to no sequence (the
  cu_seqlens + seqused form of FlashAttention's varlen API). The output has q's shape; its
  padding rows must stay unwritten, so a write across a sequence boundary is caught.
- paged: q (B, H, Nq, d) dense; k and v are page pools (P, Hkv, page_size, d). Key j of
  sequence b is in page `block_table[b, j // page_size]` at slot j % page_size. Pages are
  shuffled in the pool, a sequence's last page is partial, two sequences share a prefix
  page where a serving engine would, and table entries past a sequence's pages point at a
  page of stale keys (a valid page whose keys belong to no sequence).

Lengths, gaps and the page placement are drawn from the case alone (not from the secret):
they are the shape of the problem, which a candidate is given anyway; the values in the
tensors are what stays secret.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from harness.core.seeds import derive_seed

if TYPE_CHECKING:
    import torch

    from harness.core.cases import Case


class Layout(StrEnum):
    """How a case's sequences are laid out in memory (the module doc says how)."""

    DENSE = "dense"  # (B, H, N, d), every sequence Nq x Nk
    VARLEN = "varlen"  # packed sequences of their own lengths, cu_seqlens + seqused
    PAGED = "paged"  # K/V in a shuffled pool of pages behind a block table

# Draw index of a case's layout (lengths, gaps, pages): never one of the inputs' draws.
LAYOUT_DRAW = 1 << 42
# Spare pages in a pool beyond what the sequences use: stale keys that belong to nobody.
SPARE_PAGES = 2
MAX_GAP = 3  # padding rows between packed sequences, drawn from 0 ... MAX_GAP


@dataclass(frozen=True)
class Placement:
    """Where the sequences of a serving case lie: plain Python, derived from the case."""

    q_lens: tuple[int, ...]
    k_lens: tuple[int, ...]
    q_starts: tuple[int, ...]  # B + 1 slot starts (varlen), the last = packed rows
    k_starts: tuple[int, ...]
    block_table: tuple[tuple[int, ...], ...]  # paged: (B, pages per sequence)
    num_pages: int

    @property
    def total_q(self) -> int:
        return self.q_starts[-1]

    @property
    def total_k(self) -> int:
        return self.k_starts[-1]


def _lengths(case: Case, rng: random.Random) -> tuple[list[int], list[int]]:
    """Per-sequence (q, k) lengths. Sequence 0 has the full Nq x Nk; the others cycle
    through a random pair, a single query row over an odd key count, an empty query, an
    empty cache (its rows fully masked) and a single key, so one batch mixes 0, 1, odd and
    full lengths. Paged queries are dense: every sequence has Nq rows."""
    nq, nk = case.seqlen_q, case.seqlen_k
    if case.full_lengths:
        return [nq] * case.batch, [nk] * case.batch
    q_lens, k_lens = [nq], [nk]
    for b in range(1, case.batch):
        kind = (b - 1) % 5
        odd_k = rng.randrange(1, nk + 1, 2) if nk > 1 else 1
        pairs = ((rng.randint(1, nq), rng.randint(1, nk)), (1, odd_k), (0, rng.randint(1, nk)),
                 (rng.randint(1, nq), 0), (rng.randint(1, nq), 1))
        q, k = pairs[kind]
        q_lens.append(q)
        k_lens.append(k)
    if case.layout is Layout.PAGED:
        q_lens = [nq] * case.batch
    return q_lens, k_lens


def _starts(lens: list[int], rng: random.Random, gaps: bool) -> tuple[int, ...]:
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n + (rng.randint(0, MAX_GAP) if gaps else 0))
    if gaps:  # padding after the last sequence too: a write past it lands in poison
        starts[-1] += 1
    return tuple(starts)


def _pages(case: Case, k_lens: list[int], rng: random.Random) -> tuple[tuple, int]:
    ps = case.page_size
    per_seq = [-(-k // ps) for k in k_lens]
    width = max(1, -(-case.seqlen_k // ps))
    # Sequence 1 shares sequence 0's first page (a common prompt prefix) when both fill it.
    share = (not case.full_lengths and case.batch > 1 and k_lens[0] >= ps and k_lens[1] >= ps)
    needed = sum(per_seq) - (1 if share else 0)
    num_pages = needed + SPARE_PAGES
    order = list(range(num_pages))
    rng.shuffle(order)
    stale = order[needed]  # a spare page: what table entries past a sequence point at
    it = iter(order)
    table: list[tuple[int, ...]] = []
    for b, n in enumerate(per_seq):
        row = [table[0][0] if (b == 1 and share and j == 0) else next(it) for j in range(n)]
        table.append(tuple(row + [stale] * (width - n)))
    return tuple(table), num_pages


def placement(case: Case) -> Placement:
    """The lengths and placement of a varlen or paged case (module doc)."""
    if not case.is_serving:
        raise ValueError(f"case {case.id} has the dense layout")
    # The shape of the problem, not its precision: an fp8 KV cache (harness.core.fp8) is
    # placed as the same case in the dtype is, so the two compare.
    shape_case = case if case.fp8.value == "none" else replace(case, fp8="none")
    rng = random.Random(derive_seed(shape_case, 0, LAYOUT_DRAW))
    q_lens, k_lens = _lengths(case, rng)
    varlen = case.layout is Layout.VARLEN
    gaps = varlen and not case.full_lengths
    q_starts = _starts(q_lens, rng, gaps) if varlen else ()
    k_starts = _starts(k_lens, rng, gaps) if varlen else ()
    table, num_pages = ((), 0) if varlen else _pages(case, k_lens, rng)
    return Placement(tuple(q_lens), tuple(k_lens), q_starts, k_starts, table, num_pages)


@dataclass
class ServingIndex:
    """The index tensors a varlen or paged candidate reads (int32, on the inputs'
    device): lengths always, slot starts for varlen, the block table for paged."""

    seqlens_q: torch.Tensor
    seqlens_k: torch.Tensor
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    block_table: torch.Tensor | None = None

    def to(self, device: str | torch.device) -> ServingIndex:
        return ServingIndex(**{f.name: None if getattr(self, f.name) is None else
                               getattr(self, f.name).to(device) for f in fields(self)})

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: t for f in fields(self) if (t := getattr(self, f.name)) is not None}


def index_for(case: Case) -> ServingIndex:
    import torch

    pl = placement(case)

    def i32(x) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int32)

    return ServingIndex(i32(pl.q_lens), i32(pl.k_lens),
                        i32(pl.q_starts) if pl.q_starts else None,
                        i32(pl.k_starts) if pl.k_starts else None,
                        i32(pl.block_table) if pl.block_table else None)


def tensor_shapes(case: Case) -> dict[str, tuple[int, ...]]:
    """Shapes of q, k/v (K's: d_qk wide) and the output of a case, in every layout."""
    b, h, hkv, d = case.batch, case.heads, case.kv_heads, case.head_dim
    if case.layout is Layout.DENSE:
        q, kv = (b, h, case.seqlen_q, d), (b, hkv, case.seqlen_k, d)
    else:
        pl = placement(case)
        if case.layout is Layout.VARLEN:
            q, kv = (1, h, pl.total_q, d), (1, hkv, pl.total_k, d)
        else:
            q, kv = (b, h, case.seqlen_q, d), (pl.num_pages, hkv, case.page_size, d)
    # V and the output are d_v wide (Case.head_dim_v; dense cases only)
    return {"q": q, "kv": kv, "out": (*q[:3], case.dv)}


def offset(case: Case, q_len: int, k_len: int) -> int:
    """The alignment offset o of the module doc."""
    return 0 if case.window_top_left else k_len - q_len


def key_interval(case: Case, q_len: int, k_len: int, i: int) -> tuple[int, int]:
    """[lo, hi) of the keys query row i of a (q_len x k_len) sequence sees (the causal and
    window rules of the module doc; an empty interval has hi <= lo)."""
    o = offset(case, q_len, k_len)
    lo, hi = 0, k_len
    if case.mask.is_causal:
        hi = min(hi, i + o + 1)
    if case.window_right >= 0:
        hi = min(hi, i + o + case.window_right + 1)
    if case.window_left >= 0:
        lo = max(lo, i + o - case.window_left)
    return lo, hi


def seq_visibility(case: Case, q_len: int, k_len: int) -> torch.Tensor:
    """(q_len, k_len) boolean visibility of one sequence (module doc)."""
    import torch

    o = offset(case, q_len, k_len)
    i = torch.arange(q_len)[:, None] + o
    j = torch.arange(k_len)[None, :]
    vis = torch.ones((q_len, k_len), dtype=torch.bool)
    if case.mask.is_causal:
        vis &= j <= i
    if case.window_right >= 0:
        vis &= j <= i + case.window_right
    if case.window_left >= 0:
        vis &= j >= i - case.window_left
    return vis


def row_valid(case: Case) -> torch.Tensor | None:
    """Varlen: (Tq,) True for rows that belong to a sequence, False for padding; None
    for the other layouts (every output row belongs to its sequence)."""
    import torch

    if case.layout is not Layout.VARLEN:
        return None
    pl = placement(case)
    valid = torch.zeros(pl.total_q, dtype=torch.bool)
    for b, n in enumerate(pl.q_lens):
        valid[pl.q_starts[b]:pl.q_starts[b] + n] = True
    return valid


def intervals(case: Case, q_len: int, k_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) int64 tensors of `key_interval` for every row of a sequence, at once."""
    import torch

    i = torch.arange(q_len, dtype=torch.int64) + offset(case, q_len, k_len)
    lo = torch.zeros_like(i)
    hi = torch.full_like(i, k_len)
    if case.mask.is_causal:
        hi = torch.minimum(hi, i + 1)
    if case.window_right >= 0:
        hi = torch.minimum(hi, i + case.window_right + 1)
    if case.window_left >= 0:
        lo = torch.maximum(lo, i - case.window_left)
    return lo, hi


def sequence_lengths(case: Case) -> list[tuple[int, int]]:
    """(q_len, k_len) of every sequence (batch entry) of a case, in any layout."""
    if case.is_serving:
        pl = placement(case)
        return list(zip(pl.q_lens, pl.k_lens, strict=True))
    return [(case.seqlen_q, case.seqlen_k)] * case.batch


def visible_pairs(case: Case) -> int:
    """Visible (query, key) pairs of a serving case (or a dense case with a window whose
    mask is none or causal), over sequences and heads, from the key intervals."""
    total = 0
    for q_len, k_len in sequence_lengths(case):
        lo, hi = intervals(case, q_len, k_len)
        total += int((hi - lo).clamp_min(0).sum())
    return total * case.heads


def keys_touched(case: Case, q_len: int, k_len: int) -> int:
    """Keys of a sequence some row sees. Both ends of a row's interval grow with the row
    and consecutive intervals touch (window_left + window_right >= 0), so the union is
    one interval: from the least lo to the largest hi over the rows that see a key."""
    lo, hi = intervals(case, q_len, k_len)
    seen = hi > lo
    if not bool(seen.any()):
        return 0
    return int(hi[seen].max()) - int(lo[seen].min())


def make_serving_tensors(case: Case, device: str | torch.device, seed: int) -> tuple:
    """(q, k, v, ServingIndex): q, k, v ~ N(0, 1) in the layout's shapes, on `device`
    (padding rows and stale pages hold values of their own, so that a read of them
    changes the result)."""
    import torch

    shapes = tensor_shapes(case)
    big = max(_numel(shapes["q"]), _numel(shapes["kv"])) > (1 << 24)
    draw_dev = torch.device(device) if big else torch.device("cpu")
    gen = torch.Generator(device=draw_dev)
    gen.manual_seed(seed)
    dt = case.torch_dtype

    def draw(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=draw_dev, dtype=torch.float32).to(dt)

    q, k, v = draw(shapes["q"]), draw(shapes["kv"]), draw(shapes["kv"])
    return q.to(device), k.to(device), v.to(device), index_for(case).to(device)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def gather_pages(case: Case, pool: torch.Tensor, index: ServingIndex) -> torch.Tensor:
    """(B, Hkv, Nk, d) dense keys (or values) of a paged case: key j of sequence b from
    page block_table[b, j // page_size], slot j % page_size; keys past a sequence's length
    are 0 (the oracle's mask hides them)."""
    import torch

    ps = case.page_size
    j = torch.arange(case.seqlen_k, device=pool.device)
    table = index.block_table.to(pool.device).long()
    page = table[:, j // ps]  # (B, Nk)
    dense = pool[page, :, (j % ps)[None, :].expand_as(page)]  # (B, Nk, Hkv, d)
    dense = dense.permute(0, 2, 1, 3).contiguous()
    live = j[None, :] < index.seqlens_k.to(pool.device).long()[:, None]  # (B, Nk)
    return dense * live[:, None, :, None].to(dense.dtype)


def oracle_problem(case: Case, inputs) -> tuple:
    """(q, k, v, mask) of one plain attention call that is the case: varlen as the packed
    sequences under a block-diagonal mask (a query attends within its own sequence only;
    padding rows see nothing), paged as the gathered dense K/V under per-sequence
    lengths. The mask is (B|1, 1, Nq|Tq, Nk|Tk) boolean."""
    import torch

    pl = placement(case)
    index: ServingIndex = inputs.serving
    if case.layout is Layout.VARLEN:
        mask = torch.zeros((1, 1, pl.total_q, pl.total_k), dtype=torch.bool)
        for b, (ql, kl) in enumerate(zip(pl.q_lens, pl.k_lens, strict=True)):
            qs, ks = pl.q_starts[b], pl.k_starts[b]
            mask[0, 0, qs:qs + ql, ks:ks + kl] = seq_visibility(case, ql, kl)
        return inputs.q, inputs.k, inputs.v, mask
    mask = torch.zeros((case.batch, 1, case.seqlen_q, case.seqlen_k), dtype=torch.bool)
    for b, (ql, kl) in enumerate(zip(pl.q_lens, pl.k_lens, strict=True)):
        mask[b, 0, :ql, :kl] = seq_visibility(case, ql, kl)
    k = gather_pages(case, inputs.k, index)
    v = gather_pages(case, inputs.v, index)
    return inputs.q, k, v, mask
