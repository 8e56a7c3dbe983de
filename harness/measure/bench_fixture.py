"""pytest-benchmark's `benchmark` fixture driven by device time: the project's timing
method (harness.measure.timing) sample by sample, so pytest-benchmark's statistics and
comparisons are of the same samples a perf run takes."""

from __future__ import annotations

from typing import Any

from harness.core.candidate import Candidate
from harness.core.cases import Case
from harness.core.results import Timing
from harness.measure.perf import make_launch, output_buffers


def benchmark_device_time(benchmark: Any, candidate: Candidate, case: Case, *,
                          mode: str = "cold", min_time_s: float = 0.5, min_rounds: int = 10,
                          max_rounds: int = 2000, secret: int = 0) -> Timing:
    """Drive pytest-benchmark's `benchmark` fixture with device time.

    The test must be marked `@pytest.mark.benchmark(timer=harness.measure.timing.DEVICE_CLOCK)`:
    each round takes one sample by the timing method (held stream, L2 flush, CUDA events)
    and advances that clock by the sample, so pytest-benchmark's statistics (and
    --benchmark-json) are device time. Throttled samples and samples whose hold expired
    are retaken, as `measure` drops them. Rounds: enough for `min_time_s` of sampling.
    Returns the same samples as a Timing; raises if pytest-benchmark's data are not
    exactly these samples (the test was not given the device clock)."""
    import math
    import time

    import torch

    from harness.core.cases import make_inputs
    from harness.core.iomodel import ideal_bytes
    from harness.measure.timing import (
        DEVICE_CLOCK,
        DeviceTimer,
        SampleRun,
        is_throttled,
        sets_needed,
        to_timing,
        warm_up,
    )

    timer = DeviceTimer.get().begin()
    n = sets_needed(ideal_bytes(case), timer.l2_bytes, mode)
    sets = [make_inputs(case, "cuda", secret=secret, draw=i) for i in range(n)]
    out, lse = output_buffers(candidate, case)
    launch = make_launch(candidate, case, sets, out, lse)
    flush = mode == "cold"
    warm_up(launch, n)
    t0 = time.perf_counter()
    for i in range(3):
        timer.sample(launch, i % n, flush=flush)
    per_sample = (time.perf_counter() - t0) / 3
    rounds = max(min_rounds, min(max_rounds, math.ceil(min_time_s / max(per_sample, 1e-6))))
    run = SampleRun()
    state = {"i": 0}

    def one_sample() -> None:
        for _ in range(10):
            s = timer.sample(launch, state["i"] % n, flush=flush)
            state["i"] += 1
            if not s.valid:
                run.dropped_invalid += 1
            elif is_throttled(s.sm_clock_mhz, timer.reference_clock_mhz):
                run.dropped_throttled += 1
                time.sleep(0.05)
            else:
                run.samples_ms.append(s.ms)
                if s.sm_clock_mhz is not None:
                    run.clocks_mhz.append(s.sm_clock_mhz)
                DEVICE_CLOCK.advance_ms(s.ms)
                return
        raise RuntimeError("no valid sample in 10 tries (GPU throttled, or the launch "
                           "blocks the host)")

    benchmark.pedantic(one_sample, rounds=rounds, iterations=1, warmup_rounds=0)
    torch.cuda.synchronize()
    stats = getattr(benchmark, "stats", None)
    if stats is not None:  # None when pytest-benchmark is disabled (e.g. under xdist)
        data = list(stats.stats.data)
        expect = [ms / 1000.0 for ms in run.samples_ms]
        if len(data) != len(expect) or any(abs(a - b) > 1e-9 + 1e-6 * b
                                           for a, b in zip(data, expect, strict=True)):
            raise RuntimeError("pytest-benchmark did not measure device time: mark the test "
                               "@pytest.mark.benchmark(timer=harness.measure.timing.DEVICE_CLOCK)")
    run.stop_reason = f"{rounds} pytest-benchmark rounds"
    timing = to_timing(run, mode=mode, method=timer.method(mode, n, run.stop_reason))
    benchmark.extra_info.update({
        "candidate": candidate.name, "kind": candidate.kind, "algorithm": candidate.algorithm,
        "case": case.id, "timing_method": timing.method,
        "dropped_throttled": run.dropped_throttled, "median_ms": timing.median_ms,
    })
    return timing

