"""The plain-Python half of the timing method (harness.measure.timing): the stopping rule, the
statistics of a sample set, the clock filter and the number of input sets a cold
measurement rotates through. No GPU needed: tested with a fake clock and a fake sampler.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from harness.core.results import Timing

NOISE_MEASURE = "(IQR/1.349)/median"
THROTTLE_FRACTION = 0.75
THROTTLE_SLEEP_S = 0.05
HOLD_TIMEOUT_S = 2.0
MAX_HOLD_EXPIRIES = 3
FLUSH_FACTOR = 2.0
MAX_SETS = 32


@dataclass(frozen=True)
class StopRule:
    target_rel_noise: float = 0.005
    min_samples: int = 20  # enough for the regression test to see a 3% step (bench/detection_power.py)
    min_time_s: float = 0.5
    max_time_s: float = 15.0
    max_samples: int = 50_000
    plateau_window: int = 20  # noise estimates looked at to decide it stopped changing
    plateau_tol: float = 0.02

    def __post_init__(self) -> None:
        if self.min_samples < 2:
            raise ValueError("StopRule.min_samples must be >= 2")
        if self.max_time_s <= 0 or self.min_time_s < 0:
            raise ValueError("StopRule times must be positive")


QUICK_RULE = StopRule(min_samples=10, min_time_s=0.05, max_time_s=2.0)


@dataclass
class Sample:
    ms: float
    sm_clock_mhz: float | None = None
    valid: bool = True  # False: the stream hold expired first, launch latency may be inside


@dataclass
class SampleRun:
    samples_ms: list[float] = field(default_factory=list)
    dropped_throttled: int = 0
    dropped_invalid: int = 0
    stop_reason: str = ""
    elapsed_s: float = 0.0
    noise_history: list[float] = field(default_factory=list)
    clocks_mhz: list[float] = field(default_factory=list)  # of the kept samples, when read


# ---------------------------------------------------------------- statistics (pure Python)


def quartiles(samples: Sequence[float]) -> tuple[float, float, float]:
    """(q1, median, q3) with linear interpolation between order statistics (numpy's
    default percentile method), so the numbers match what numpy users would compute."""
    if not samples:
        raise ValueError("no samples")
    s = sorted(samples)
    n = len(s)

    def q(p: float) -> float:
        pos = p * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    return q(0.25), q(0.5), q(0.75)


def rel_noise(samples: Sequence[float]) -> float:
    """Robust relative noise (IQR / 1.349) / median; inf when it cannot be estimated."""
    if len(samples) < 2:
        return math.inf
    q1, med, q3 = quartiles(samples)
    if med <= 0:
        return math.inf
    return (q3 - q1) / 1.349 / med


def is_throttled(sm_clock_mhz: float | None, reference_mhz: float | None,
                 fraction: float = THROTTLE_FRACTION) -> bool:
    """True when the clock is known and below `fraction` of the reference clock."""
    if sm_clock_mhz is None or not reference_mhz:
        return False
    return sm_clock_mhz < fraction * reference_mhz


def plateaued(history: Sequence[float], window: int, tol: float) -> bool:
    """Has the noise estimate stopped changing? Least-squares slope of the last `window`
    estimates, projected over the window, relative to their mean."""
    if len(history) < max(window, 3):
        return False
    ys = [y for y in history[-window:] if math.isfinite(y)]
    if len(ys) < max(window, 3):
        return False
    n = len(ys)
    mx = (n - 1) / 2
    my = sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in range(n))
    slope = sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sxx
    if my <= 0:
        return True
    return abs(slope) * n <= tol * my


def sample_until_stable(
    take: Callable[[int], Sample],
    rule: StopRule = StopRule(),
    *,
    reference_clock_mhz: float | None = None,
    throttle_fraction: float = THROTTLE_FRACTION,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    throttle_sleep_s: float = THROTTLE_SLEEP_S,
    give_up: Callable[[list[float]], str | None] | None = None,
) -> SampleRun:
    """Call `take(i)` for i = 0, 1, ... until the stopping rule says stop (module doc).
    `give_up(samples)`, asked after every kept sample, may stop the run early with its
    reason (a submission far slower than the baseline is not sampled to the rule's end)."""
    run = SampleRun()
    t0 = clock()
    i = 0
    noise = math.inf
    next_estimate = 2
    while True:
        elapsed = clock() - t0
        if elapsed >= rule.max_time_s:
            run.stop_reason = f"timeout {rule.max_time_s:g}s"
            break
        if len(run.samples_ms) >= rule.max_samples:
            run.stop_reason = f"max samples {rule.max_samples}"
            break
        s = take(i)
        i += 1
        if not s.valid:
            run.dropped_invalid += 1
            continue
        if is_throttled(s.sm_clock_mhz, reference_clock_mhz, throttle_fraction):
            run.dropped_throttled += 1
            sleep(throttle_sleep_s)
            continue
        run.samples_ms.append(float(s.ms))
        if s.sm_clock_mhz is not None:
            run.clocks_mhz.append(float(s.sm_clock_mhz))
        n = len(run.samples_ms)
        if give_up is not None:
            why = give_up(run.samples_ms)
            if why:
                run.stop_reason = why
                break
        # Re-estimating the noise costs O(n); past a few hundred samples do it at ~1%
        # steps, which is as often as the estimate can change anyway.
        if n >= next_estimate:
            noise = rel_noise(run.samples_ms)
            run.noise_history.append(noise)
            next_estimate = n + max(1, n // 100)
        elapsed = clock() - t0
        if n >= rule.min_samples and elapsed >= rule.min_time_s:
            if noise <= rule.target_rel_noise:
                run.stop_reason = f"noise {noise:.2%} <= {rule.target_rel_noise:.2%}"
                break
            if plateaued(run.noise_history, rule.plateau_window, rule.plateau_tol):
                run.stop_reason = f"noise converged at {noise:.2%}"
                break
    run.elapsed_s = clock() - t0
    return run


def to_timing(run: SampleRun, *, mode: str, method: str) -> Timing:
    s = run.samples_ms
    t = Timing(samples_ms=list(s), dropped_throttled=run.dropped_throttled, mode=mode,
               method=method,
               sm_clock_mhz=statistics.median(run.clocks_mhz) if run.clocks_mhz else None)
    if s:
        q1, med, q3 = quartiles(s)
        t.median_ms, t.min_ms, t.iqr_ms = med, min(s), q3 - q1
        t.rel_noise = rel_noise(s) if len(s) > 1 else None
    return t


def sets_needed(bytes_per_set: int, l2_bytes: int | None, mode: str = "cold",
                factor: float = FLUSH_FACTOR, cap: int = MAX_SETS) -> int:
    """Input sets to rotate so that the sets together span >= factor x L2 (module doc).
    Warm mode keeps one set on purpose: warm means L2-resident inputs."""
    if mode == "warm" or not l2_bytes or bytes_per_set <= 0:
        return 1
    return max(1, min(cap, math.ceil(factor * l2_bytes / bytes_per_set)))


class DeviceClock:
    """A clock that only advances by measured device time.

    pytest-benchmark times a round as timer() after minus timer() before; giving it this
    clock (`@pytest.mark.benchmark(timer=clock)`) and advancing it inside the benchmarked
    call by the event-measured sample makes its statistics device time."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds

    def advance_ms(self, ms: float) -> None:
        self.seconds += ms / 1000.0

    def __repr__(self) -> str:
        return "DeviceClock(device seconds)"


# The clock the pytest-benchmark front uses: @pytest.mark.benchmark(timer=DEVICE_CLOCK).
DEVICE_CLOCK = DeviceClock()
