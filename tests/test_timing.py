"""The timing method's statistics and stopping rule, driven by a fake clock and a fake
sampler so they run without a GPU."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

from harness.measure.timing import (
    DeviceClock,
    Sample,
    StopRule,
    is_throttled,
    plateaued,
    quartiles,
    rel_noise,
    sample_until_stable,
    sets_needed,
    to_timing,
)


class FakeGpu:
    """Each sample advances a fake wall clock by its own duration plus overhead."""

    def __init__(self, draw, overhead_s=0.001, clocks=None):
        self.t = 0.0
        self.draw = draw
        self.overhead_s = overhead_s
        self.clocks = clocks or (lambda i: 1980.0)
        self.slept = 0.0
        self.calls = 0

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept += s
        self.t += s

    def take(self, i: int) -> Sample:
        self.calls += 1
        ms = self.draw(i)
        self.t += ms / 1000 + self.overhead_s
        return Sample(ms=ms, sm_clock_mhz=self.clocks(i))

    def run(self, rule: StopRule | None = None, **kw):
        return sample_until_stable(self.take, rule or StopRule(), clock=self.clock,
                                   sleep=self.sleep, **kw)


def test_quartiles_match_numpy():
    rng = random.Random(3)
    for n in (1, 2, 3, 10, 101):
        xs = [rng.random() for _ in range(n)]
        q1, med, q3 = quartiles(xs)
        assert np.allclose([q1, med, q3], np.percentile(xs, [25, 50, 75]))


def test_rel_noise_is_robust_to_one_outlier():
    xs = [1.0 + 0.001 * (i % 5) for i in range(100)]
    base = rel_noise(xs)
    assert rel_noise(xs + [50.0]) < 2 * base  # stdev/mean would explode here
    assert rel_noise([1.0]) == math.inf
    # a normal sample's robust noise estimates its relative stdev
    rng = random.Random(1)
    normal = [1.0 + rng.gauss(0, 0.01) for _ in range(20000)]
    assert rel_noise(normal) == pytest.approx(0.01, rel=0.05)


def test_quiet_kernel_stops_on_noise_after_min_count_and_time():
    gpu = FakeGpu(lambda i: 1.0 + 0.0001 * (i % 3))
    run = gpu.run(StopRule(min_samples=10, min_time_s=0.5))
    assert run.stop_reason.startswith("noise")
    assert len(run.samples_ms) >= 10
    assert run.elapsed_s >= 0.5  # min time is honoured even when the noise is tiny
    assert run.elapsed_s < 0.6


def test_min_count_is_honoured_for_a_slow_kernel():
    gpu = FakeGpu(lambda i: 200.0)  # 0.2 s per sample: min time reached after 3
    run = gpu.run(StopRule(min_samples=10, min_time_s=0.5))
    assert len(run.samples_ms) == 10


def test_noisy_but_stable_distribution_stops_on_convergence_before_timeout():
    rng = random.Random(7)
    gpu = FakeGpu(lambda i: 1.0 + rng.gauss(0, 0.03))  # 3% noise, never under 0.5%
    run = gpu.run(StopRule(max_time_s=15.0))
    assert run.stop_reason.startswith("noise converged"), run.stop_reason
    assert run.elapsed_s < 15.0
    assert run.noise_history[-1] > 0.005


def test_ever_noisier_sampler_runs_into_the_timeout():
    gpu = FakeGpu(lambda i: 1.0 + (i % 2) * (0.01 * i))  # spread keeps growing
    run = gpu.run(StopRule(max_time_s=3.0, plateau_tol=0.001))
    assert run.stop_reason.startswith("timeout")
    assert 3.0 <= run.elapsed_s < 3.1


def test_throttled_samples_are_dropped_counted_and_slept_on():
    clocks = lambda i: 900.0 if i % 4 == 0 else 1980.0  # noqa: E731
    gpu = FakeGpu(lambda i: 5.0 if i % 4 == 0 else 1.0, clocks=clocks)
    run = gpu.run(StopRule(min_samples=20, min_time_s=0.1), reference_clock_mhz=1980.0)
    assert run.dropped_throttled > 0
    assert all(ms == 1.0 for ms in run.samples_ms)  # slow throttled samples are gone
    assert gpu.slept == pytest.approx(0.05 * run.dropped_throttled)
    timing = to_timing(run, mode="cold", method="fake")
    assert timing.dropped_throttled == run.dropped_throttled
    assert timing.median_ms == 1.0


def test_the_median_clock_is_of_the_kept_samples_only():
    clocks = lambda i: 900.0 if i % 4 == 0 else 1950.0 + (i % 3) * 10  # noqa: E731
    gpu = FakeGpu(lambda i: 5.0 if i % 4 == 0 else 1.0, clocks=clocks)
    run = gpu.run(StopRule(min_samples=20, min_time_s=0.1), reference_clock_mhz=1980.0)
    assert run.dropped_throttled > 0 and len(run.clocks_mhz) == len(run.samples_ms)
    assert min(run.clocks_mhz) >= 1950.0  # the throttled samples' 900 MHz are gone with them
    timing = to_timing(run, mode="cold", method="fake")
    assert timing.sm_clock_mhz == statistics.median(run.clocks_mhz)
    unread = gpu.run(StopRule(min_samples=5, min_time_s=0.0))
    unread.clocks_mhz.clear()  # NVML unavailable: no clock, not a made-up one
    assert to_timing(unread, mode="cold", method="fake").sm_clock_mhz is None


def test_no_reference_clock_means_no_filter():
    gpu = FakeGpu(lambda i: 1.0, clocks=lambda i: 100.0)
    run = gpu.run(StopRule(min_samples=10, min_time_s=0.0), reference_clock_mhz=None)
    assert run.dropped_throttled == 0


def test_invalid_samples_are_dropped():
    calls = {"n": 0}

    def take(i):
        calls["n"] += 1
        return Sample(ms=9.0 if i < 3 else 1.0, valid=i >= 3)

    t = [0.0]

    def clock():
        t[0] += 0.01
        return t[0]

    run = sample_until_stable(take, StopRule(min_samples=10, min_time_s=0.0), clock=clock)
    assert run.dropped_invalid == 3 and 9.0 not in run.samples_ms


def test_is_throttled_threshold():
    assert is_throttled(1484, 1980)  # < 75%
    assert not is_throttled(1485, 1980)
    assert not is_throttled(None, 1980)
    assert not is_throttled(500, None)


def test_plateau_detection():
    assert plateaued([0.02] * 20, 20, 0.02)
    assert not plateaued([0.02 + 0.001 * i for i in range(20)], 20, 0.02)
    assert not plateaued([0.02] * 5, 20, 0.02)  # too few estimates


def test_to_timing_statistics():
    from harness.measure.timing import SampleRun

    run = SampleRun(samples_ms=[4.0, 1.0, 2.0, 3.0, 5.0], dropped_throttled=2, stop_reason="x")
    t = to_timing(run, mode="warm", method="m")
    assert (t.median_ms, t.min_ms, t.iqr_ms) == (3.0, 1.0, 2.0)
    assert t.samples_ms == [4.0, 1.0, 2.0, 3.0, 5.0]  # raw order kept
    assert t.rel_noise == pytest.approx(2.0 / 1.349 / 3.0)
    assert t.mode == "warm" and t.dropped_throttled == 2
    empty = to_timing(SampleRun(), mode="cold", method="m")
    assert empty.median_ms is None and empty.samples_ms == []


def test_sets_needed_from_bytes_and_l2():
    l2 = 60 << 20
    assert sets_needed(10 << 20, l2) == 12  # 120 MiB / 10 MiB
    assert sets_needed(1 << 30, l2) == 1
    assert sets_needed(1 << 10, l2) == 32  # capped
    assert sets_needed(10 << 20, l2, mode="warm") == 1
    assert sets_needed(10 << 20, None) == 1


def test_device_clock_advances_only_by_device_time():
    c = DeviceClock()
    before = c()
    c.advance_ms(1.5)
    assert c() - before == pytest.approx(0.0015)


def test_stop_rule_validation():
    with pytest.raises(ValueError):
        StopRule(min_samples=1)


def test_measure_rejects_unknown_mode():
    from harness.measure.timing import measure

    with pytest.raises(ValueError, match="mode"):
        measure(lambda i: None, mode="hot")
