"""The order in which the gate takes a candidate's timing cases (harness.runs.plan).

`spread_order`: a few timed cases should already cover the kinds of case a grid holds,
not its smallest shapes. Cases are grouped in strata (decode or not, head dim, mask,
dtype, GQA or not, layout, window or not); the strata are visited in turn, each time the one farthest from
those already visited (the fewest attributes in common with the nearest of them, so the
first picks alternate head dims, masks, dtypes and decode), and within a stratum the middle sequence length comes first, then its
neighbours outwards. Deterministic: the same cases in, the same order out, in every
process (the warm-up and the timing child must see the same shapes in the same order).
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.core.cases import Case

DECODE_MAX_SEQLEN_Q = 16


def _stratum(c: Case) -> tuple:
    layout = str(getattr(c.layout, "value", c.layout))
    return (c.seqlen_q <= DECODE_MAX_SEQLEN_Q, c.head_dim, str(getattr(c.mask, "value", c.mask)),
            c.dtype, c.kv_heads != c.heads, layout, c.has_window)


def _middle_out(cases: list[Case]) -> list[Case]:
    ordered = sorted(cases, key=lambda c: (c.seqlen_q * c.seqlen_k, c.batch, c.id))
    mid = (len(ordered) - 1) // 2
    out = [ordered[mid]]
    for step in range(1, len(ordered)):
        for i in (mid + step, mid - step):
            if 0 <= i < len(ordered) and ordered[i] not in out:
                out.append(ordered[i])
    return out


def spread_order(cases: Sequence[Case]) -> list[Case]:
    """`cases` in the order of the module doc."""
    strata: dict[tuple, list[Case]] = {}
    for c in cases:
        strata.setdefault(_stratum(c), []).append(c)
    queues = {k: _middle_out(v) for k, v in strata.items()}
    keys = sorted(queues, key=repr)
    def far(k: tuple, visited: list[tuple]) -> tuple[int, int]:
        # farthest point first: the fewest attributes shared with any visited stratum,
        # then the most attribute values not visited yet
        if not visited:
            return (0, 0)
        nearest = min(sum(a != b for a, b in zip(k, v, strict=True)) for v in visited)
        unseen = sum(all(k[i] != v[i] for v in visited) for i in range(len(k)))
        return (nearest, unseen)

    visit: list[tuple] = []
    while len(visit) < len(keys):
        left = [k for k in keys if k not in visit]
        best = max(left, key=lambda k: (*far(k, visit), -keys.index(k)))
        visit.append(best)
    out: list[Case] = []
    while any(queues.values()):
        for k in visit:
            if queues[k]:
                out.append(queues[k].pop(0))
    return out


def cheapest_first(cases: Sequence[Case], cost: Sequence[float]) -> list[Case]:
    return [c for _, c in sorted(zip(cost, cases, strict=True), key=lambda t: (t[0], t[1].id))]
