"""Harness-owned output buffers (guards, poison) and input snapshots."""

from __future__ import annotations

import pytest
import torch

from harness.core.buffers import GUARD_BYTES, InputSnapshot, OutputBuffers
from harness.core.cases import Case, MaskKind, make_inputs

CASE = Case(2, 3, 1, 5, 7, 16, "bfloat16", MaskKind.RANDOM)


def test_layout_and_poison():
    b = OutputBuffers.allocate(CASE, "cpu", writes_lse=True)
    assert b.out.shape == (2, 3, 5, 16) and b.out.dtype == torch.bfloat16
    assert b.lse.shape == (2, 3, 5) and b.lse.dtype == torch.float32
    assert b.out.is_contiguous() and b.lse.is_contiguous()
    assert torch.isnan(b.out).all() and torch.isnan(b.lse).all()
    assert b.out.storage_offset() * 2 == GUARD_BYTES
    assert OutputBuffers.allocate(CASE, "cpu", writes_lse=False).lse is None


def test_unwritten_reports_first_index_and_count():
    b = OutputBuffers.allocate(CASE, "cpu", writes_lse=True)
    assert "out: 480 of 480" in b.unwritten()
    b.out.zero_()
    b.lse.zero_()
    assert b.unwritten() is None and b.check_guards() is None
    b.out[1, 2, 4, 15] = float("nan")  # a canonical NaN is written, not poison
    assert b.unwritten() is None
    b.poison()
    b.out.fill_(1.0)
    b.out[1, 0, 3, 2:4] = torch.tensor([float("nan")]).bfloat16()  # fine
    b.lse[:, :, :-1] = 0.0
    msg = b.unwritten()
    assert msg == "lse: 6 of 30 element(s) never written, first at index (0, 0, 4)"


def test_guard_writes_are_caught_on_both_sides():
    b = OutputBuffers.allocate(CASE, "cpu", writes_lse=False)
    b.out.zero_()
    off = b.out.storage_offset()
    torch.as_strided(b.out, (1,), (1,), off + b.out.numel() + 2).fill_(3.0)
    torch.as_strided(b.out, (1,), (1,), off - 1).fill_(3.0)
    msg = b.check_guards()
    assert "after the output (nearest at offset +2" in msg
    assert "before the output (nearest at offset -1" in msg


def test_input_snapshot_names_the_changed_input():
    case = Case(2, 2, 2, 4, 6, 8, mask=MaskKind.KEY_PADDING)
    inp = make_inputs(case)
    snap = InputSnapshot.take(inp)
    assert snap.changed(inp) is None
    inp.v[0, 0, 0, 0] += 1
    assert snap.changed(inp) == "input v was modified (1 element(s) changed)"
    inp.v[0, 0, 0, 0] = snap.copies["v"][0, 0, 0, 0]  # restored bit for bit
    assert snap.changed(inp) is None
    inp.mask[1, 0, 0, 0] = ~inp.mask[1, 0, 0, 0]
    assert "input mask was modified" in snap.changed(inp)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
def test_guards_poison_and_snapshot_on_cuda():
    b = OutputBuffers.allocate(CASE, "cuda", writes_lse=True)
    assert b.out.is_cuda and torch.isnan(b.out).all()
    b.out.zero_()
    b.lse[:, :, 1:] = 0.0
    assert b.unwritten() == "lse: 6 of 30 element(s) never written, first at index (0, 0, 0)"
    off = b.out.storage_offset()
    torch.as_strided(b.out, (1,), (1,), off + b.out.numel()).fill_(1.0)
    assert "after the output (nearest at offset +0" in b.check_guards()
    inp = make_inputs(CASE, "cuda")
    snap = InputSnapshot.take(inp)
    inp.q[0, 0, 0, 0] += 1
    assert snap.changed(inp) == "input q was modified (1 element(s) changed)"
