"""Every shipped CUDA variant against the float64 oracle, on a GPU (skipped without one).

Run on the GPU machine:  pytest -m gpu tests/test_cuda_variants_gpu.py -v
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.candidates.expr import parse_expr
from harness.core.cases import Case, MaskKind, make_inputs
from harness.core.results import Status

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
pytest.importorskip("cupy")

from harness.candidates.cuda_candidate import CudaVariant, LaunchRefused  # noqa: E402
from harness.candidates.variants import KERNELS_ROOT, load_variant_dir  # noqa: E402
from harness.core.check import check_case  # noqa: E402

SHIPPED = ("template", "naive", "fa1", "fa2_simt", "splitkv")
M = MaskKind

# Odd lengths (partial tiles), Nq > Nk (fully masked rows under bottom-right causal),
# GQA/MQA, every mask kind, both dtypes; a few per variant keep the file quick.
GENERAL_CASES = [
    Case(2, 4, 4, 113, 203, 64, "float16", M.NONE),
    Case(2, 4, 4, 113, 203, 64, "bfloat16", M.CAUSAL_BR),
    Case(2, 4, 2, 203, 113, 64, "float16", M.CAUSAL_BR),
    Case(2, 4, 2, 203, 113, 128, "bfloat16", M.CAUSAL_TL),
    Case(3, 4, 1, 128, 217, 128, "float16", M.KEY_PADDING),
    Case(2, 6, 2, 97, 256, 64, "bfloat16", M.RANDOM),
    Case(1, 4, 4, 1, 239, 128, "float16", M.NONE),
    Case(1, 4, 4, 1, 1, 64, "float16", M.CAUSAL_BR),
    Case(1, 4, 4, 113, 203, 40, "float16", M.RANDOM),
    Case(1, 4, 2, 217, 128, 96, "bfloat16", M.CAUSAL_BR),
    Case(1, 2, 2, 127, 513, 59, "float16", M.KEY_PADDING),
    Case(1, 2, 1, 256, 512, 111, "bfloat16", M.NONE),
    Case(1, 2, 2, 64, 64, 256, "float16", M.CAUSAL_TL),
]
DECODE_CASES = [
    Case(1, 32, 8, 1, 8192, 128, "float16", M.NONE),
    Case(2, 8, 2, 1, 4099, 128, "bfloat16", M.KEY_PADDING),
    Case(2, 8, 8, 1, 3000, 64, "float16", M.RANDOM),
    Case(1, 16, 2, 3, 799, 64, "bfloat16", M.CAUSAL_BR),   # Nq > 1, group of 8: 6 row chunks
    Case(1, 4, 4, 5, 1000, 128, "float16", M.CAUSAL_TL),
    Case(2, 4, 1, 17, 300, 64, "float16", M.NONE),
]


def _variant(name: str, **changes) -> CudaVariant:
    spec = load_variant_dir(KERNELS_ROOT / name)
    if changes:
        spec = dataclasses.replace(spec, **changes)
    return CudaVariant.from_spec(spec)


def _check(cand: CudaVariant, case: Case, repeats: int = 1):
    reason = cand.supports(case)
    if reason:
        pytest.skip(f"{cand.name}: {reason}")
    res = check_case(cand, case, device="cuda", repeats=repeats)
    assert res.status is Status.PASSED, f"{cand.name} {case.id}: {res.status} {res.message}"
    return res


@pytest.mark.parametrize("case", GENERAL_CASES + DECODE_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("name", SHIPPED)
def test_variant_matches_oracle(name, case):
    _check(_variant(name), case)


@pytest.mark.parametrize("splits", [1, 2, 3, 17, 55])
@pytest.mark.parametrize("case", DECODE_CASES[:4], ids=lambda c: c.id)
def test_splitkv_forced_splits(case, splits):
    """num_splits 1 (no combine), forced counts including more splits than key chunks."""
    _check(_variant("splitkv", num_splits=splits), case)


@pytest.mark.parametrize("name", SHIPPED)
def test_deterministic_and_resources(name):
    case = Case(1, 8, 2, 1, 2048, 128) if name == "splitkv" else Case(2, 4, 2, 113, 203, 64)
    cand = _variant(name)
    res = _check(cand, case, repeats=20)
    assert "bitwise equal" in res.extra.get("race_check", "")
    resources = cand.meta["resources"]
    assert resources and all(r["local_bytes"] == 0 for r in resources.values()), resources


def test_launch_refused_before_launching():
    spec = _variant("fa2_simt").spec
    launch = dataclasses.replace(spec.launches[0], shared_mem=parse_expr("1048576"))
    bad = CudaVariant.from_spec(dataclasses.replace(spec, launches=(launch,)))
    case = Case(1, 2, 2, 64, 64, 64)
    out = torch.zeros(1, 2, 64, 64, dtype=torch.float16, device="cuda")
    with pytest.raises(LaunchRefused, match="shared memory"):
        bad.run(case, make_inputs(case, "cuda"), out, None)
    assert torch.count_nonzero(out) == 0


@pytest.mark.exclusive  # a bandwidth reading: the GPU to itself
def test_splitkv_decode_bandwidth():
    """The decode shape of the brief: Nq = 1, 32 query heads over 8 kv heads, d = 128,
    Nk = 131072. Memory bound: report K+V bytes / time; far below 1 TB/s means broken."""
    case = Case(1, 32, 8, 1, 131072, 128, "float16", M.NONE)
    cand = _variant("splitkv")
    inputs = make_inputs(case, "cuda")
    out = torch.empty(1, 32, 1, 128, dtype=torch.float16, device="cuda")
    lse = torch.empty(1, 32, 1, dtype=torch.float32, device="cuda")
    for _ in range(3):
        cand.run(case, inputs, out, lse)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 20
    start.record()
    for _ in range(iters):
        cand.run(case, inputs, out, lse)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / iters
    kv_bytes = 2 * case.batch * case.kv_heads * case.seqlen_k * case.head_dim * 2
    gbps = kv_bytes / (ms * 1e-3) / 1e9
    print(f"splitkv decode: {ms * 1e3:.1f} us, {gbps:.0f} GB/s, splits={cand.meta['num_splits']}")
    assert gbps > 1000, f"decode at {gbps:.0f} GB/s"


def test_cached_launches_match_uncached_and_follow_new_inputs():
    """The launch cache (harness.candidates.cuda_candidate.run): the same bits as the
    uncached path, also when a new input set of the same case lands at the addresses of a
    freed one, and when the mask changes in place."""
    case = Case(2, 4, 2, 113, 203, 64, "float16", MaskKind.RANDOM)
    cached, plain = _variant("fa2_simt"), _variant("fa2_simt")
    plain.cache_launches = False
    plain.launch_via_driver = False  # and CuPy's own launch: the same bits again
    lse = torch.empty(2, 4, 113, dtype=torch.float32, device="cuda")
    for draw in range(3):  # each set freed before the next: the allocator reuses addresses
        inputs = make_inputs(case, "cuda", draw=draw)
        a = torch.empty(2, 4, 113, 64, dtype=torch.float16, device="cuda")
        b = torch.empty_like(a)
        cached.run(case, inputs, a, lse)
        plain.run(case, inputs, b, lse)
        torch.cuda.synchronize()
        assert torch.equal(a, b), draw
        inputs.mask.logical_not_()  # in place: the version counter moves
        cached.run(case, inputs, a, lse)
        plain.run(case, inputs, b, lse)
        torch.cuda.synchronize()
        assert torch.equal(a, b), draw
        del inputs, a, b
    assert cached.meta["launch_path"] == "driver" and plain.meta["launch_path"] == "cupy"
    # and the check, twice with different secrets, on the cached candidate
    for secret in (0, 7):
        res = check_case(cached, case, device="cuda", secret=secret)
        assert res.status is Status.PASSED, res.message


@pytest.mark.exclusive  # a host-time reading: no other process on the cores
def test_cached_launch_host_cost_is_small():
    import time

    case = Case(1, 16, 16, 512, 512, 128, "float16", MaskKind.NONE)
    cand = _variant("fa2_mma")
    inputs = make_inputs(case, "cuda")
    out = torch.empty(1, 16, 512, 128, dtype=torch.float16, device="cuda")
    lse = torch.empty(1, 16, 512, dtype=torch.float32, device="cuda")
    for _ in range(10):
        cand.run(case, inputs, out, lse)
    torch.cuda.synchronize()
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        cand.run(case, inputs, out, lse)
    host_us = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    print(f"fa2_mma cached launch: {host_us:.1f} us host per call")
    assert host_us < 100, host_us  # bench/launch_overhead.py measures the 30 us target
