"""The split-KV CUDA kernel (kernels/splitkv) on the serving layouts, on a GPU (skipped
without one): varlen decode batches (padding rows left unwritten), paged caches (page
sizes that are and are not multiples of the 16-key slice), sliding windows, forced split
counts, the combine fused (as shipped) and as a second kernel, against the float64 oracle
through the harness's check.

Run on the GPU machine:  pytest -m gpu tests/test_splitkv_serving_gpu.py -v
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.core.cases import Case, Layout, MaskKind
from harness.core.grids import decode, serving_grid
from harness.core.results import Status

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
pytest.importorskip("cupy")

from harness.candidates.cuda_candidate import CudaVariant  # noqa: E402
from harness.candidates.expr import parse_expr  # noqa: E402
from harness.candidates.variants import KERNELS_ROOT, load_variant_dir  # noqa: E402
from harness.core.check import check_case  # noqa: E402

M = MaskKind
P, V = Layout.PAGED, Layout.VARLEN


def _splitkv(**changes) -> CudaVariant:
    spec = load_variant_dir(KERNELS_ROOT / "splitkv")
    return CudaVariant.from_spec(dataclasses.replace(spec, **changes) if changes else spec)


def _two_kernels() -> CudaVariant:
    """The kernel without SK_FUSED_COMBINE: the splits are combined by a second kernel,
    one block per query row (the form the manifest's comment describes)."""
    spec = load_variant_dir(KERNELS_ROOT / "splitkv")
    combine = dataclasses.replace(
        spec.launches[0], entry="splitkv_combine_{dtype}_d{head_dim}",
        grid=(parse_expr("batch * heads * seqlen_q * min(num_splits - 1, 1)"),
              parse_expr(1), parse_expr(1)),
        block=(parse_expr(128), parse_expr(1), parse_expr(1)), shared_mem=parse_expr(0))
    return CudaVariant.from_spec(dataclasses.replace(
        spec, compile_options=tuple(o for o in spec.compile_options
                                    if not o.startswith("-DSK_FUSED_COMBINE")),
        launches=(spec.launches[0], combine),
        workspaces=tuple(w for w in spec.workspaces if w.name != "tickets")))


CAND = _splitkv()
SERVING = [c for c in serving_grid() if CAND.supports(c) is None]
# The decode grid's serving forms at its shortest cache (the longer ones: bench/).
DECODE_SERVING = [c for c in decode() if c.is_serving and c.seqlen_k == 8192]
# Page sizes off the 16-key slice (every row looked up), windows, GQA of 8 at Nq > 1.
EXTRA = [
    Case(3, 8, 2, 1, 700, 128, "float16", M.NONE, layout=P, page_size=40),
    Case(2, 4, 4, 3, 333, 64, "bfloat16", M.CAUSAL_BR, layout=P, page_size=7),
    Case(4, 16, 2, 2, 517, 128, "bfloat16", M.CAUSAL_TL, window_left=50, window_right=0,
         layout=P, page_size=24),
    Case(6, 8, 1, 5, 300, 64, "float16", M.NONE, window_left=20, window_right=3, layout=V),
    Case(5, 32, 8, 1, 4000, 128, "float16", M.NONE, layout=V),
    Case(2, 8, 2, 1, 1000, 128, "float16", M.NONE, window_left=100, window_right=-1),
    Case(2, 8, 8, 4, 1000, 64, "bfloat16", M.CAUSAL_BR, window_left=64, window_right=0),
]


def _check(cand: CudaVariant, case: Case, repeats: int = 1):
    reason = cand.supports(case)
    assert reason is None, f"{case.id}: {reason}"
    res = check_case(cand, case, device="cuda", repeats=repeats)
    assert res.status is Status.PASSED, f"{case.id}: {res.status} {res.message}"
    return res


def test_serving_grid_is_covered():
    kinds = {(c.layout, c.has_window) for c in SERVING}
    assert {(V, False), (P, False), (P, True)} <= kinds, kinds


@pytest.mark.parametrize("case", SERVING + DECODE_SERVING + EXTRA, ids=lambda c: c.id)
def test_matches_oracle(case):
    _check(CAND, case)


@pytest.mark.parametrize("splits", [1, 3, 64])
@pytest.mark.parametrize("case", [EXTRA[0], EXTRA[3], EXTRA[4], DECODE_SERVING[0]],
                         ids=lambda c: c.id)
def test_forced_splits(case, splits):
    """One split (no combine), a few, and more splits than the keys have chunks."""
    _check(_splitkv(num_splits=splits), case)


def test_varlen_is_deterministic():
    res = _check(CAND, EXTRA[4], repeats=5)
    assert "bitwise equal" in res.extra.get("race_check", "")


@pytest.mark.parametrize("case", SERVING[::3] + EXTRA + DECODE_SERVING[:3],
                         ids=lambda c: c.id)
def test_two_kernel_combine(case):
    _check(_two_kernels(), case, repeats=2)


def test_tickets_are_zero_between_calls():
    """The fused combine's counters: zero when allocated, zero again after every call
    (the CTA that takes a row chunk's last ticket resets it)."""
    cand = _splitkv()
    case = EXTRA[4]
    res = _check(cand, case, repeats=3)
    assert res.status is Status.PASSED
    state = cand._state
    assert state is not None and state.num_splits > 1
    names = [w.name for w in cand.spec.workspaces]
    tickets = state.workspaces[names.index("tickets")]
    torch.cuda.synchronize()
    assert tickets.numel() >= case.batch * case.kv_heads and int(tickets.abs().sum()) == 0


def test_a_varlen_case_times():
    """The timing path allocates the packed output of a varlen case."""
    from harness.measure.perf import time_case

    case = next(c for c in DECODE_SERVING if c.layout is V)
    t = time_case(CAND, case, rule={"min_samples": 3, "min_time_s": 0.01, "max_time_s": 1.0})
    assert t.median_ms and t.median_ms > 0
