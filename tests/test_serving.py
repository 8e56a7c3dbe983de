"""The serving case kinds (varlen, paged, sliding window): ids, placement, the oracle's
semantics against an independent computation, FLOPs, buffers and the check protocol."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from harness.core import flops, serving
from harness.core.buffers import OutputBuffers
from harness.core.candidate import Candidate, Support
from harness.core.cases import Case, Layout, MaskKind, make_inputs
from harness.core.check import check_case
from harness.core.grids import get_grid
from harness.core.reference import attention_ref, reference_for_case
from harness.core.results import Status

VARLEN = Case(6, 4, 2, 37, 53, 64, "float16", MaskKind.CAUSAL_BR, layout=Layout.VARLEN)
PAGED = Case(5, 4, 2, 3, 300, 64, "bfloat16", MaskKind.NONE, layout=Layout.PAGED,
             page_size=32)
WINDOWED = Case(2, 4, 1, 100, 120, 64, "float16", MaskKind.NONE, window_left=10,
                window_right=5)


# --- the independent computation: per sequence, with loops for the rule ------------------

def _visible(case: Case, q_len: int, k_len: int, i: int, j: int) -> bool:
    """The module doc's rule, written out per pair."""
    o = 0 if case.mask is MaskKind.CAUSAL_TL else k_len - q_len
    if j >= k_len:
        return False
    if case.mask.is_causal and j > i + o:
        return False
    if case.window_right >= 0 and j > i + o + case.window_right:
        return False
    return not (case.window_left >= 0 and j < i + o - case.window_left)


def _attend(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
    """One sequence: q (H, n, d), k/v (Hkv, m, d) -> out, lse through the plain oracle
    with a mask built pair by pair."""
    n, m = q.shape[1], k.shape[1]
    if n == 0:
        return q.double()[None], torch.empty((1, q.shape[0], 0), dtype=torch.float64)
    if m == 0:
        return (torch.zeros_like(q, dtype=torch.float64)[None],
                torch.full((1, q.shape[0], n), -math.inf, dtype=torch.float64))
    mask = torch.tensor([[_visible(case, n, m, i, j) for j in range(m)] for i in range(n)])
    return attention_ref(q[None], k[None], v[None], mask=mask[None, None])


def _independent(case: Case, inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack (or walk the pages), attend per sequence, repack."""
    pl = serving.placement(case)
    if case.layout is Layout.VARLEN:
        out = torch.zeros(inputs.q.shape, dtype=torch.float64)
        lse = torch.full(inputs.q.shape[:3], -math.inf, dtype=torch.float64)
        for b, (n, m) in enumerate(zip(pl.q_lens, pl.k_lens, strict=True)):
            qs, ks = pl.q_starts[b], pl.k_starts[b]
            o, lz = _attend(case, inputs.q[0, :, qs:qs + n], inputs.k[0, :, ks:ks + m],
                            inputs.v[0, :, ks:ks + m])
            out[0, :, qs:qs + n], lse[0, :, qs:qs + n] = o[0], lz[0]
        return out, lse
    outs, lses = [], []
    for b, m in enumerate(pl.k_lens):
        rows = [(pl.block_table[b][j // case.page_size], j % case.page_size) for j in range(m)]
        k = torch.stack([inputs.k[p, :, s] for p, s in rows], 1) if rows else \
            inputs.k[:1, :, :0].reshape(case.kv_heads, 0, case.head_dim)
        v = torch.stack([inputs.v[p, :, s] for p, s in rows], 1) if rows else k
        o, lz = _attend(case, inputs.q[b], k, v)
        outs.append(o[0])
        lses.append(lz[0])
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("case", [VARLEN, PAGED,
                                  Case(5, 6, 2, 20, 41, 64, "float16", MaskKind.CAUSAL_TL,
                                       window_left=7, layout=Layout.VARLEN),
                                  Case(4, 4, 1, 3, 500, 64, "float16", MaskKind.CAUSAL_BR,
                                       window_left=32, window_right=0, layout=Layout.PAGED,
                                       page_size=64)],
                         ids=lambda c: c.id)
def test_oracle_matches_per_sequence_attention(case):
    inputs = make_inputs(case)
    out, lse = reference_for_case(case, inputs)
    want_out, want_lse = _independent(case, inputs)
    valid = serving.row_valid(case)
    if valid is not None:  # padding rows are no output: compare sequence rows only
        out, lse = out[:, :, valid], lse[:, :, valid]
        want_out, want_lse = want_out[:, :, valid], want_lse[:, :, valid]
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    live = ~torch.isneginf(want_lse)
    torch.testing.assert_close(lse[live], want_lse[live], rtol=1e-12, atol=1e-12)
    assert not torch.isnan(out).any()


def test_dense_window_matches_the_pairwise_rule():
    inputs = make_inputs(WINDOWED)
    out, _ = reference_for_case(WINDOWED, inputs)
    n, m = WINDOWED.seqlen_q, WINDOWED.seqlen_k
    mask = torch.tensor([[_visible(WINDOWED, n, m, i, j) for j in range(m)] for i in range(n)])
    want, _ = attention_ref(inputs.q, inputs.k, inputs.v, mask=mask[None, None])
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    assert flops.visible_pairs(WINDOWED) == int(mask.sum()) * WINDOWED.batch * WINDOWED.heads


def test_ids_round_trip_and_bad_combinations():
    for case in get_grid("serving") + get_grid("decode"):
        assert Case.from_id(case.id) == case
        assert Case.from_dict(case.to_dict()) == case
    assert PAGED.id == "b5h4k2-3x300-d64-bf16-none-paged32"
    assert WINDOWED.id == "b2h4k1-100x120-d64-fp16-none-wl10r5"
    for bad in (dict(layout=Layout.PAGED), dict(page_size=16),
                dict(layout=Layout.VARLEN, mask=MaskKind.RANDOM),
                dict(window_left=-2), dict(full_lengths=True)):
        kw = {"mask": MaskKind.NONE, **bad}
        with pytest.raises(ValueError, match="invalid case"):
            Case(2, 4, 4, 10, 10, 64, "float16", **kw)


def test_placement_mixes_lengths_pads_and_shares_pages():
    pl = serving.placement(Case(6, 4, 4, 37, 53, 64, layout=Layout.VARLEN))
    assert pl.q_lens[0] == 37 and pl.k_lens[0] == 53
    assert 0 in pl.q_lens and 0 in pl.k_lens and 1 in pl.q_lens
    assert any(k % 2 for k in pl.k_lens)
    gaps = [pl.q_starts[b + 1] - pl.q_starts[b] - n for b, n in enumerate(pl.q_lens)]
    assert any(gaps) and gaps[-1] >= 1  # padding between and after the sequences
    pl = serving.placement(PAGED)
    table = pl.block_table
    assert table[1][0] == table[0][0]  # a shared prefix page
    used = {p for b, row in enumerate(table)
            for p in row[:-(-pl.k_lens[b] // PAGED.page_size)] if pl.k_lens[b]}
    stale = {row[-1] for b, row in enumerate(table) if pl.k_lens[b] < PAGED.seqlen_k}
    assert stale and not (stale & used)  # entries past a sequence point at no one's page
    assert sorted(used) != list(range(len(used)))  # shuffled
    assert any(k % PAGED.page_size for k in pl.k_lens)  # a partial last page
    full = serving.placement(Case(3, 4, 4, 1, 4096, 64, layout=Layout.PAGED, page_size=64,
                                  full_lengths=True))
    assert set(full.k_lens) == {4096} and len({p for r in full.block_table for p in r}) == 192


@pytest.mark.parametrize("case", [VARLEN, PAGED], ids=lambda c: c.id)
def test_flops_count_only_each_sequences_pairs(case):
    q, k, v, mask = serving.oracle_problem(case, make_inputs(case))
    assert flops.visible_pairs(case) == int(mask.sum()) * case.heads


@dataclass
class _PerSequence(Candidate):
    """A correct varlen/paged candidate (the same-precision attention per sequence), with
    one optional fault."""

    fault: str = ""

    def run(self, case, inputs, out, lse):
        from harness.core.reference import attention_naive, problem_for_case

        q, k, v, flags = problem_for_case(case, inputs)
        o, lz = attention_naive(q, k, v, **flags)
        valid = serving.row_valid(case)
        rows = valid.nonzero().flatten() if valid is not None else torch.arange(o.shape[2])
        if self.fault == "padding":
            rows = torch.arange(o.shape[2])
        if self.fault == "drop_last_row":
            rows = rows[:-1]
        out[:, :, rows] = o[:, :, rows].to(out.dtype)
        if lse is not None:
            lse[:, :, rows] = lz[:, :, rows].float()


def _candidate(fault: str = "") -> _PerSequence:
    support = Support(layouts=frozenset(Layout), window=True)
    return _PerSequence(name=f"per_seq{fault}", kind="python", device="cpu", support=support,
                        fault=fault)


@pytest.mark.parametrize("case", [VARLEN, PAGED, WINDOWED], ids=lambda c: c.id)
def test_check_case_passes_a_correct_candidate(case):
    result = check_case(_candidate(), case, device="cpu", repeats=2)
    assert result.status is Status.PASSED, result.message
    assert result.flops == 4 * case.head_dim * flops.visible_pairs(case)


def test_a_write_into_the_padding_and_an_unwritten_row_fail():
    result = check_case(_candidate("padding"), VARLEN, device="cpu")
    assert result.status is Status.FAILED
    assert "padding between packed sequences" in result.message
    result = check_case(_candidate("drop_last_row"), VARLEN, device="cpu")
    assert result.status is Status.FAILED and "never written" in result.message


def test_candidates_without_the_layout_are_skipped_with_the_reason():
    plain = _PerSequence(name="dense_only", kind="python", device="cpu")
    assert "varlen layout not supported" in check_case(plain, VARLEN, device="cpu").message
    assert "sliding window not supported" in check_case(plain, WINDOWED, device="cpu").message


def test_output_buffers_take_the_packed_shape():
    bufs = OutputBuffers.allocate(VARLEN, "cpu", writes_lse=True)
    pl = serving.placement(VARLEN)
    assert tuple(bufs.out.shape) == (1, VARLEN.heads, pl.total_q, VARLEN.head_dim)
    assert tuple(bufs.lse.shape) == (1, VARLEN.heads, pl.total_q)
    bufs = OutputBuffers.allocate(PAGED, "cpu", writes_lse=True)
    assert tuple(bufs.out.shape) == (PAGED.batch, PAGED.heads, PAGED.seqlen_q, PAGED.head_dim)
