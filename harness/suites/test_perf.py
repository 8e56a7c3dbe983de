"""Performance of every selected candidate on the perf grid, through pytest-benchmark,
in device time.

    pytest harness/suites/test_perf.py --fa-kernels 'fa2*,sdpa_flash' --benchmark-json perf.json

Ids are like the correctness suite's (`fa2_mma-b4h16-4096x4096-d128-fp16-none`). Each
test first checks the candidate on its case (isolated candidates in a child process, so
a crashing kernel fails its test instead of the session), then times it: every
pytest-benchmark round is one sample of harness.measure.timing's method (held stream, L2 flush,
CUDA events, throttled samples retaken), and pytest-benchmark's timer is the device
clock those samples advance, so its min/median/IQR and --benchmark-json are device time.
TFLOP/s, bytes (IO model and ideal), the candidate and the timing method go in
`extra_info`. The grid is the perf grid (`fa_grid` marker); FA_PERF_MODE=warm times
without the L2 flush. Needs a CUDA GPU; skips without one.
"""

from __future__ import annotations

import os

import pytest

from harness.core.results import Status
from harness.measure.timing import DEVICE_CLOCK

pytestmark = [pytest.mark.gpu, pytest.mark.fa_grid("perf")]


@pytest.mark.benchmark(timer=DEVICE_CLOCK, group="perf")
def test_perf(benchmark, fa_candidate, fa_case, fa_check):
    import torch

    from harness.core.iomodel import ideal_bytes
    from harness.measure.bench_fixture import benchmark_device_time

    if not torch.cuda.is_available():
        pytest.skip("the perf suite needs a CUDA GPU")
    if fa_candidate.device != "cuda":
        pytest.skip(f"{fa_candidate.name} runs on the CPU: not timed")
    res = fa_check(fa_candidate, fa_case)
    if res.status is Status.SKIPPED:
        pytest.skip(res.message)
    if res.status is not Status.PASSED:
        pytest.fail(f"not timed, the check {res.status.value}: {res.message}", pytrace=False)
    benchmark.group = fa_case.id  # compare candidates per case in pytest-benchmark's table
    mode = os.environ.get("FA_PERF_MODE", "cold")
    timing = benchmark_device_time(benchmark, fa_candidate, fa_case, mode=mode)
    assert timing.median_ms and timing.median_ms > 0
    seconds = timing.median_ms * 1e-3
    benchmark.extra_info.update({
        "flops": res.flops,
        "tflops": res.flops / seconds / 1e12 if res.flops else None,
        "bytes_model": res.bytes_model,
        "bytes_ideal": res.bytes_ideal if res.bytes_ideal is not None else ideal_bytes(fa_case),
        "mode": mode,
        "gpu": torch.cuda.get_device_name(),
    })
