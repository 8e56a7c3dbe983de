"""triton_fa2's serving shapes (harness.core.serving): sliding windows on the dense layout
and the varlen layout, judged by check_case; key blocks outside a window never read; a
varlen run leaves the padding rows between packed sequences alone; the backward refuses
them. On the CPU through Triton's interpreter, on a GPU the whole serving grid."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from harness.candidates import discovery, registry
from harness.core.cases import Case, Layout, MaskKind
from harness.core.grids import get_grid
from harness.core.results import Status

# Serving-grid cases small enough for the interpreter, chosen to meet every window
# shape of the grid (left only, a single key, two-sided, right only, wide left) on both
# layouts, both causal alignments and none, GQA and MQA, and varlen batches with empty
# sequences, empty caches (fully masked rows), single rows and single keys.
SERVING_IDS = (
    "b6h4k2-64x64-d128-bf16-causal_br-varlen",
    "b6h6k2-64x64-d64-fp16-causal_tl-varlen",
    "b6h6k2-1x239-d64-bf16-none-varlen",
    "b6h4-97x1-d64-fp16-causal_br-varlen",
    "b6h4k2-203x113-d64-fp16-causal_br-varlen",
    "b2h4-113x203-d64-fp16-none-wl0r0",
    "b2h4k2-113x203-d128-fp16-causal_br-wl32r0",
    "b2h4k1-203x113-d64-fp16-causal_tl-wl32r0",
    "b2h4-203x113-d64-fp16-none-wl64r16",
    "b2h4k2-113x203-d64-fp16-none-wr8",
    "b2h4k1-113x203-d128-fp16-causal_br-wl100",
    "b5h4k2-97x211-d64-fp16-none-wl32r0-varlen",
    "b5h4k1-97x211-d64-bf16-causal_tl-wl0r0-varlen",
    "b5h4-97x211-d128-fp16-none-wl64r16-varlen",
    "b5h4k2-97x211-d128-bf16-none-wr8-varlen",
    "b5h6k2-97x211-d64-fp16-causal_br-wl0r0-varlen",
)
# Windows of one key either side on Nq = Nk: each query block's key range then ends one
# key into a key block and starts one key before one, for any tile sizes that divide each
# other, so a block bound off by one drops a visible key (the grid's windows rarely meet a
# block edge). Then windows over the mask kinds the grid does not combine them with, and
# dense smoke cases without a window (the plain kernel unchanged).
EXTRA_IDS = (
    "b2h4k2-100x100-d64-fp16-none-wl1r1",
    "b4h4k1-70x70-d64-bf16-none-wl1r1-varlen",
    "b3h4k2-70x90-d64-fp16-key_padding-wl20r7",
    "b2h4k1-45x80-d59-bf16-random-wl9r30",
    "b2h4-113x203-d64-fp16-causal_br",
    "b2h4-113x203-d64-bf16-random",
    "b2h6k2-97x64-d64-fp16-key_padding",
)


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.delenv(discovery.ENV_CONFIG, raising=False)
    monkeypatch.setattr(discovery, "_config", discovery.Config())
    registry.clear_cache()
    yield
    registry.clear_cache()


def _triton():
    return next(c for c in registry.discover(("python",)) if c.name == "triton_fa2")


def _in_the_interpreter(code: str) -> dict:
    """Run `code` in a fresh process under Triton's CPU interpreter (Triton reads
    TRITON_INTERPRET when it is imported); its last stdout line is JSON."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _interpreter_only() -> None:
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the GPU runs the compiled kernel (test_serving_grid_gpu)")


def test_the_selection_is_of_the_serving_grid_and_covers_it():
    grid = {c.id: c for c in get_grid("serving")}
    cases = [grid[i] for i in SERVING_IDS]  # a KeyError: the grid changed, pick again
    assert {c.layout for c in cases} == {Layout.DENSE, Layout.VARLEN}
    assert {c.mask for c in cases} == {MaskKind.NONE, MaskKind.CAUSAL_BR, MaskKind.CAUSAL_TL}
    windows = {(c.window_left, c.window_right) for c in cases if c.has_window}
    assert windows == {(32, 0), (0, 0), (64, 16), (-1, 8), (100, -1)}
    assert {c.heads // c.kv_heads for c in cases} >= {1, 2, 4}
    extra = [Case.from_id(i) for i in EXTRA_IDS]
    assert {c.mask for c in extra if c.has_window} >= {MaskKind.KEY_PADDING, MaskKind.RANDOM}


@pytest.mark.slow
def test_serving_cases_in_the_interpreter():
    """check_case (buffers, padding rows, tolerance) on the selection, in Triton's CPU
    interpreter: every case passes."""
    _interpreter_only()
    code = f"""
import json
from harness.candidates import registry
from harness.core.cases import Case
from harness.core.check import check_case
tri = next(c for c in registry.discover(("python",)) if c.name == "triton_fa2")
assert registry.unavailable_reason(tri) is None and tri.device == "cpu"
out = {{}}
for case_id in {SERVING_IDS + EXTRA_IDS!r}:
    res = check_case(tri, Case.from_id(case_id), device="cpu")
    out[case_id] = [res.status.value, res.message]
print(json.dumps(out))
"""
    got = _in_the_interpreter(code)
    bad = {k: v for k, v in got.items() if v[0] != "passed"}
    assert len(got) == len(SERVING_IDS + EXTRA_IDS) and not bad, bad


@pytest.mark.slow
def test_window_skips_blocks_and_varlen_keeps_its_padding_rows():
    """The kernel itself, called directly in the interpreter:
    - a key block entirely outside a query block's window (either end) is never read: with
      NaN in those keys' K and V (a read would turn p = 0 into NaN through P V), that
      query block's rows are bitwise what the clean inputs give;
    - varlen written into caller buffers: every padding row between (and after) the
      packed sequences keeps its sentinel, every sequence row is written."""
    _interpreter_only()
    code = """
import json, math
import torch
from harness.candidates import triton_fa2 as t
from harness.core import serving
from harness.core.cases import Case, Layout, MaskKind, make_inputs
out = {}
bm, bn = t._tiles(64)[:2]
n = 4 * bm
kw = dict(mask_kind="none", mask=None, key_lengths=None, causal_offset=0, scale=0.125,
          window_left=2, window_right=3)
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 2, n, 64, generator=g).half() for _ in range(3))
clean, _ = t.triton_fa2_fn(q, k, v, **kw)
# The first query block's keys end at bm + 3 (two key blocks when bn = bm): keys from
# 2 * bn on are past its right edge. The last one's start at 3 * bm - 2.
first_hi = -(-(bm + 3) // bn) * bn
last_lo = (3 * bm - 2) // bn * bn
for name, keys, rows in (("right", slice(first_hi, n), slice(0, bm)),
                         ("left", slice(0, last_lo), slice(3 * bm, n))):
    k2, v2 = k.clone(), v.clone()
    k2[:, :, keys] = float("nan")
    v2[:, :, keys] = float("nan")
    got, _ = t.triton_fa2_fn(q, k2, v2, **kw)
    out[name] = bool(torch.equal(got[:, :, rows], clean[:, :, rows]))
    out[name + "_poisoned_elsewhere"] = bool(got.isnan().any())
case = Case(6, 4, 2, 37, 53, 64, "float16", MaskKind.CAUSAL_BR, window_left=9,
            layout=Layout.VARLEN)
inp = make_inputs(case)
o = torch.full(inp.q.shape, 7.0, dtype=inp.q.dtype)
lse = torch.full(inp.q.shape[:3], 7.0)
t.triton_fa2_fn(inp.q, inp.k, inp.v, mask_kind="causal_br", mask=None, key_lengths=None,
                causal_offset=0, scale=0.125, window_left=9, window_right=-1,
                layout="varlen", serving=inp.serving, max_seqlen_q=37, max_seqlen_k=53,
                out=o, lse=lse)
valid = serving.row_valid(case)
out["padding_rows"] = int((~valid).sum())
out["padding_kept"] = bool((o[:, :, ~valid] == 7).all() and (lse[:, :, ~valid] == 7).all())
out["rows_written"] = bool((o[:, :, valid] != 7).all() and (lse[:, :, valid] != 7).all())
print(json.dumps(out))
"""
    got = _in_the_interpreter(code)
    assert got["right"] and got["left"], got
    assert got["right_poisoned_elsewhere"] and got["left_poisoned_elsewhere"], \
        f"the NaN keys reached no row: the probe proves nothing {got}"
    assert got["padding_rows"] > 0 and got["padding_kept"] and got["rows_written"], got


def test_the_backward_refuses_windows_and_varlen():
    """The backward is dense-only: a windowed or varlen case's backward is skipped with
    the reason (its forward is supported)."""
    tri = _triton()
    assert tri.support.window and tri.support.layouts == {Layout.DENSE, Layout.VARLEN}
    windowed = Case(2, 4, 2, 64, 80, 64, "float16", MaskKind.CAUSAL_BR, window_left=16)
    varlen = Case(3, 4, 2, 64, 80, 64, "float16", MaskKind.NONE, layout=Layout.VARLEN)
    paged = Case(3, 4, 2, 1, 80, 64, "float16", MaskKind.NONE, layout=Layout.PAGED,
                 page_size=16)
    for case in (windowed, varlen):
        assert tri.supports(case) is None
        assert tri.supports_backward(case), case.id
    assert tri.supports_backward(Case(2, 4, 2, 64, 80, 64, "float16")) is None
    assert "paged layout not supported" in (tri.supports(paged) or "")


@pytest.mark.gpu
def test_serving_grid_gpu():
    """On a GPU: the compiled kernel on every case of the serving grid it supports (the
    dense windows and the varlen batches; paged is skipped), in isolated children split
    by mask kind as the CI gate runs them."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from harness.execution.runner import run_correctness
    from harness.runs.gate_prepare import split_python

    tri = _triton()
    reason = registry.unavailable_reason(tri)
    if reason:
        pytest.skip(f"triton_fa2: {reason}")
    results = run_correctness([tri], get_grid("serving"), parallel=3, split=split_python)
    bad = [f"{r.case.id}: {r.status.value}: {r.message}" for r in results
           if r.status not in (Status.PASSED, Status.SKIPPED)]
    assert not bad, "\n".join(bad)
    passed = [r.case for r in results if r.status is Status.PASSED]
    skipped = [r.case for r in results if r.status is Status.SKIPPED]
    assert all(c.layout is Layout.PAGED for c in skipped), [c.id for c in skipped]
    assert len(passed) == sum(c.layout is not Layout.PAGED for c in get_grid("serving"))
