"""How many key splits the split-KV CUDA kernel launches (kernels/splitkv).

Decoding reads the whole KV cache for one query row per head: the work is a few long
streams, too few thread blocks to keep every SM reading. The kernel cuts each sequence's
visible keys into `splits` pieces of whole chunks (`block_k` keys) and combines the
partial results afterwards; how many pieces is decided here, from the shape alone.

The model: one block per (sequence, kv head, row chunk) and split. Every resident block
slot (SMs x blocks per SM) should have work, and the slowest block decides the time:

- the fair share of a slot is `ceil(total chunks / slots)`; `splits` is the count that
  cuts the longest sequence's blocks down to that share, so a mixed-length batch (a
  varlen decode batch) is split for its longest cache, not for its average one;
- with equal lengths every block does the same work, and more blocks than slots would
  leave a second, partial wave running while most SMs idle: the count stops at
  `slots // blocks`, one full wave;
- enough blocks without splitting (their count reaches the slots): 1, no combine;
- never more splits than the longest sequence has chunks (the rest would be empty),
  never more than `max_splits`.

`choose_splits` is plain arithmetic (tested on the CPU); `splitkv_work` turns a case into
its (blocks, chunks) per sequence, through the serving placement for varlen and paged
cases, whose lengths are part of the problem's shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.core.cases import Case

MAX_SPLITS = 128


def choose_splits(work: Iterable[tuple[int, int]], slots: int, *,
                  max_splits: int = MAX_SPLITS) -> int:
    """Split count for `work`: (blocks, chunks) per sequence, where `blocks` is the number
    of blocks a sequence needs without splitting (kv heads x row chunks) and `chunks` the
    key chunks each of them reads. `slots`: blocks resident at once on the device."""
    if slots < 1 or max_splits < 1:
        raise ValueError(f"choose_splits: slots ({slots}) and max_splits ({max_splits}) "
                         "must be >= 1")
    items = [(int(b), int(c)) for b, c in work]
    if any(b < 0 or c < 0 for b, c in items):
        raise ValueError(f"choose_splits: negative blocks or chunks in {items}")
    active = [(b, c) for b, c in items if b > 0 and c > 0]
    if not active:
        return 1
    blocks = sum(b for b, _ in active)
    longest = max(c for _, c in active)
    total = sum(b * c for b, c in active)
    share = math.ceil(total / slots)
    splits = math.ceil(longest / share)
    if all(c == longest for _, c in active):
        splits = min(splits, max(1, slots // blocks))
    return max(1, min(splits, longest, max_splits))


def splitkv_work(case: Case, block_rows: int, block_k: int) -> list[tuple[int, int]]:
    """(blocks, chunks) per sequence of `case` for a kernel that gives each block
    `block_rows` query rows of one kv head (a GQA group's heads together) and reads keys
    in chunks of `block_k`. A sequence's chunks span the keys its rows can see (causal
    limits and sliding windows included, one chunk of slack for a window's unaligned
    start); a sequence with no query row or no key needs no block."""
    from harness.core.serving import keys_touched, sequence_lengths

    if block_rows < 1 or block_k < 1:
        raise ValueError(f"splitkv_work: block_rows ({block_rows}) and block_k ({block_k}) "
                         "must be >= 1")
    group = case.heads // case.kv_heads
    lengths = (sequence_lengths(case) if case.is_serving
               else [(case.seqlen_q, case.seqlen_k)])  # dense: one shape for the batch
    out = []
    for q_len, k_len in lengths:
        keys = keys_touched(case, q_len, k_len) if q_len and k_len else 0
        if keys == 0:
            out.append((0, 0))
            continue
        chunks = math.ceil(keys / block_k) + (keys < k_len)
        out.append((case.kv_heads * math.ceil(group * q_len / block_rows), chunks))
    return out if case.is_serving else out * case.batch
