"""The one timing method of fa-harness. Every number the harness reports as "time" comes
from `measure` below; submissions, the perf run and the pytest-benchmark front all use it.

The method, sample by sample (cold mode, the default):

1. Hold the stream. A one-thread kernel spins on a flag in host-mapped pinned memory, so
   everything queued behind it waits on the device while the host keeps queueing. The
   spin has a timeout (`hold_timeout_s`, 2 s, read from %globaltimer) so it can never
   hang the GPU; a sample whose hold expired before release is dropped, because launch
   latency may then be inside it (after 3 such samples in a row, or one launch that held
   the host past the timeout, the hold is switched off for the rest of that measurement
   and the method string says so: the launch itself synchronises the host).
2. Queue an L2 flush: a memset of a buffer sized from the device's L2 (2 x L2 size: 120
   MiB on an H200 with 60 MiB L2), not a fixed 256 MiB.
3. Queue the start event, the launch `launch(i)`, the stop event; release the flag.
   The sample is stop - start (CUDA events, milliseconds). Host launch latency and the
   Python overhead of `launch` are not in it: the GPU only starts once all is queued.
4. Read the SM clock through NVML. A sample taken while the SM clock is below 75% of the
   reference clock (default applications clock, else max clock) is dropped and counted
   (`Timing.dropped_throttled`); the method then sleeps 50 ms to let the clock recover.

Before sampling: warm-up launches until both a count (3) and a time (50 ms) are reached
(the first launch may compile, allocate, pick a plan).

Inputs rotate among `n_sets` sets (`launch(i)` runs set i). `sets_needed` sizes the
rotation from the case's bytes against the L2: when one set fits in L2 in cold mode,
several sets are used so that each sample's inputs were last touched n_sets samples ago
with >= 2 x L2 of other data in between, which does not rely on the memset alone
evicting them (the L2 replacement policy is not documented as LRU). Warm mode: no flush
and one set, so the inputs stay L2-resident as in a loop that calls the kernel again.
The sets come from `harness.measure.perf.placed_sets`: each with its own output buffers,
behind spacers of random size, so the rotation also samples where the buffers lie (on
the H200 that alone moved one kernel by 3.5% from one allocation to the next, each
allocation steady to 0.1%), and the median is a median over placements.

Stopping rule: after at least `min_samples` (20) kept samples and `min_time_s` (0.5 s of
wall-clock sampling), stop once the relative noise is at most `target_rel_noise` (0.5%),
or once the noise estimate has stopped changing (the fitted slope of the last 20
estimates, projected over those estimates, is under 2% of their mean: more samples would
not make the distribution tighter); stop regardless at `max_time_s` (15 s). The relative
noise is robust: (IQR / 1.349) / median, the standard deviation a normal distribution with
that IQR would have, relative to the median, so a single interrupted sample does not keep
the sampler running to its timeout.

Reported (`harness.core.results.Timing`): all kept raw samples, the median (the statistic the
harness compares), min, IQR, the relative noise, the number of throttled samples dropped,
the median SM clock of the kept samples (step 4's reading; records keep it in the
result's `extra`), and `method`: a one-line description of what was actually done (hold
on or off and why, flush size, number of sets, stop reason).

Everything that needs a GPU imports torch.cuda / CuPy / NVML lazily; the statistics and
the stopping rule are plain Python, tested with a fake clock and a fake sampler.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness.core.results import Timing
from harness.measure.sampling import (
    DEVICE_CLOCK,
    FLUSH_FACTOR,
    HOLD_TIMEOUT_S,
    MAX_HOLD_EXPIRIES,
    MAX_SETS,
    NOISE_MEASURE,
    QUICK_RULE,
    THROTTLE_FRACTION,
    THROTTLE_SLEEP_S,
    DeviceClock,
    Sample,
    SampleRun,
    StopRule,
    is_throttled,
    plateaued,
    quartiles,
    rel_noise,
    sample_until_stable,
    sets_needed,
    to_timing,
)

# The method is one module to its users: the sampling half is re-exported here.
__all__ = [
    "DEVICE_CLOCK",
    "DeviceClock",
    "FLUSH_FACTOR",
    "HOLD_TIMEOUT_S",
    "MAX_HOLD_EXPIRIES",
    "MAX_SETS",
    "NOISE_MEASURE",
    "QUICK_RULE",
    "Sample",
    "SampleRun",
    "StopRule",
    "THROTTLE_FRACTION",
    "THROTTLE_SLEEP_S",
    "is_throttled",
    "plateaued",
    "quartiles",
    "rel_noise",
    "sample_until_stable",
    "sets_needed",
    "to_timing",
    "DeviceTimer", "measure", "time_callable", "timing_sets", "warm_up",
]

# ---------------------------------------------------------------- GPU side (lazy imports)

_HOLD_SOURCE = r"""
extern "C" __global__ void fa_hold_stream(unsigned long long flag_addr,
                                          unsigned long long timeout_ns) {
    // flag[0]: set to 1 by the host to release; flag[1]: set here when the hold expired.
    volatile int* flag = reinterpret_cast<volatile int*>(flag_addr);
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (flag[0] == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > timeout_ns) { flag[1] = 1; break; }
        __nanosleep(500);
    }
}
"""



class _StreamHold:
    """The flag-spin kernel and its host-mapped flag (CuPy compiles and launches it)."""

    def __init__(self, device_index: int, timeout_s: float) -> None:
        import ctypes

        import cupy as cp

        rt = cp.cuda.runtime
        with cp.cuda.Device(device_index):
            # Unified addressing makes cudaHostAlloc memory visible to kernels at its host
            # address; without it the hold cannot work and the caller runs unheld.
            if not rt.deviceGetAttribute(41, device_index):  # cudaDevAttrUnifiedAddressing
                raise RuntimeError("device has no unified addressing")
            self._ptr = rt.hostAlloc(8, 2)  # cudaHostAllocMapped
            self._kernel = cp.RawKernel(_HOLD_SOURCE, "fa_hold_stream")
            self._kernel.compile()
        self._cp = cp
        self._device_index = device_index
        self._flag = (ctypes.c_int32 * 2).from_address(self._ptr)
        self.timeout_s = timeout_s
        self._timeout_ns = int(timeout_s * 1e9)
        self._streams: dict[int, Any] = {}

    def _cupy_stream(self, torch_stream: Any) -> Any:
        key = int(torch_stream.cuda_stream)
        s = self._streams.get(key)
        if s is None:
            cp = self._cp
            from_external = getattr(cp.cuda.Stream, "from_external", None)
            try:
                s = from_external(torch_stream) if from_external else None
            except Exception:
                s = None
            if s is None:
                s = cp.cuda.ExternalStream(key, self._device_index)
            self._streams[key] = s
        return s

    def engage(self, torch_stream: Any) -> None:
        import numpy as np

        self._flag[0] = 0
        self._flag[1] = 0
        with self._cp.cuda.Device(self._device_index), self._cupy_stream(torch_stream):
            self._kernel((1,), (1,), (np.uint64(self._ptr), np.uint64(self._timeout_ns)))

    def release(self) -> None:
        self._flag[0] = 1

    def expired(self) -> bool:
        return bool(self._flag[1])

    def __del__(self) -> None:
        try:
            self._flag[0] = 1
            self._cp.cuda.runtime.freeHost(self._ptr)
        except Exception:
            pass


class DeviceTimer:
    """Per-device state of the timing method: flush buffer, events, hold, clock reader."""

    _cache: dict[tuple[int, bool], DeviceTimer] = {}

    def __init__(self, device_index: int | None = None, *, hold: bool = True,
                 hold_timeout_s: float = HOLD_TIMEOUT_S) -> None:
        import torch

        from harness.measure.gpuinfo import gpu_identity, sm_clock_reader

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU available")
        self.index = torch.cuda.current_device() if device_index is None else device_index
        self.device = torch.device("cuda", self.index)
        props = torch.cuda.get_device_properties(self.index)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0)) or None
        # No L2 size reported: fall back to 256 MiB, larger than any current L2.
        self.flush_bytes = int(FLUSH_FACTOR * self.l2_bytes) if self.l2_bytes else 256 << 20
        self._flush = torch.empty(self.flush_bytes, dtype=torch.uint8, device=self.device)
        self._start = torch.cuda.Event(enable_timing=True)
        self._stop = torch.cuda.Event(enable_timing=True)
        self._read_clock, clock_problem = sm_clock_reader(self.index)
        ident = gpu_identity(self.index)
        self.reference_clock_mhz = ident.reference_sm_clock_mhz if self._read_clock else None
        self.clock_note = (f"drop SM clock < {THROTTLE_FRACTION:.0%} of "
                           f"{self.reference_clock_mhz} MHz" if self.reference_clock_mhz
                           else f"no clock filter: {clock_problem or 'no reference clock'}")
        self._hold_kernel: _StreamHold | None = None
        self._hold_note = "no hold (disabled)"
        if hold:
            try:
                self._hold_kernel = _StreamHold(self.index, hold_timeout_s)
                self._hold_note = "stream held by flag-spin kernel"
            except Exception as e:  # no CuPy, no NVRTC, no UVA: time without the hold
                self._hold_note = f"no hold ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
        self.begin()

    def begin(self) -> DeviceTimer:
        """Start a measurement: the hold back on where this device has one. A launch that
        blocks the host switches the hold off (`sample`) for the measurement it is in,
        not for the process: the timer is shared by every measurement on the device, and
        a later candidate (or submission) timed with the hold off would have launch
        latency inside its samples."""
        self._hold = self._hold_kernel
        self.hold_note = self._hold_note
        self._expired_in_a_row = 0
        return self

    @classmethod
    def get(cls, device_index: int | None = None, *, hold: bool = True) -> DeviceTimer:
        import torch

        idx = torch.cuda.current_device() if device_index is None else device_index
        key = (idx, hold)
        if key not in cls._cache:
            cls._cache[key] = cls(idx, hold=hold)
        return cls._cache[key]

    def sample(self, launch: Callable[[int], Any], i: int, *, flush: bool = True) -> Sample:
        import torch

        stream = torch.cuda.current_stream(self.device)
        hold = self._hold
        if hold is not None:
            hold.engage(stream)
        if flush:
            self._flush.zero_()
        self._start.record(stream)
        t_host = time.perf_counter()
        launch(i)
        host_blocked_s = time.perf_counter() - t_host
        self._stop.record(stream)
        if hold is not None:
            hold.release()
        self._stop.synchronize()
        ms = self._start.elapsed_time(self._stop)
        expired = hold.expired() if hold is not None else False
        if expired:
            self._expired_in_a_row += 1
            # A launch that itself waited out the hold (it synchronises) can never be
            # measured under a hold: give it up at once instead of after a few tries.
            blocked = hold is not None and host_blocked_s >= 0.9 * hold.timeout_s
            if blocked or self._expired_in_a_row >= MAX_HOLD_EXPIRIES:
                self._hold = None
                self.hold_note = ("no hold (the launch blocks the host: hold expired "
                                  f"{MAX_HOLD_EXPIRIES} times in a row)")
        else:
            self._expired_in_a_row = 0
        clock = self._read_clock() if self._read_clock is not None else None
        return Sample(ms=ms, sm_clock_mhz=clock, valid=not expired)

    def method(self, mode: str, n_sets: int, stop_reason: str) -> str:
        flush = (f"L2 flush {self.flush_bytes / 2**20:.0f} MiB memset" if mode == "cold"
                 else "no flush (warm)")
        return (f"cuda-events; {mode}; {flush}; {self.hold_note}; sets={n_sets}; "
                f"noise={NOISE_MEASURE}; {self.clock_note}; stop: {stop_reason}")


def timing_sets(bytes_per_set: int, mode: str) -> int:
    """Input sets to rotate on this GPU so that cold timing really is cold (its L2)."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return sets_needed(bytes_per_set, int(getattr(props, "L2_cache_size", 0)) or None, mode)


def warm_up(launch: Callable[[int], Any], n_sets: int = 1, *, min_count: int = 3,
            min_time_s: float = 0.05) -> None:
    import torch

    t0 = time.perf_counter()
    i = 0
    while i < min_count or time.perf_counter() - t0 < min_time_s:
        launch(i % n_sets)
        torch.cuda.synchronize()
        i += 1


def measure(
    launch: Callable[[int], Any],
    *,
    n_sets: int = 1,
    mode: str = "cold",
    rule: StopRule | None = None,
    warmup_count: int = 3,
    warmup_s: float = 0.05,
    hold: bool = True,
    device_index: int | None = None,
) -> Timing:
    """Time `launch(i)` (i = input set, 0 <= i < n_sets) by the method of the module doc.
    `launch` must only queue GPU work on torch's current stream."""
    if mode not in ("cold", "warm"):
        raise ValueError(f"timing mode must be 'cold' or 'warm', not {mode!r}")
    n_sets = max(1, int(n_sets))
    rule = rule or StopRule()
    timer = DeviceTimer.get(device_index, hold=hold).begin()
    warm_up(launch, n_sets, min_count=warmup_count, min_time_s=warmup_s)
    flush = mode == "cold"
    run = sample_until_stable(lambda i: timer.sample(launch, i % n_sets, flush=flush), rule,
                              reference_clock_mhz=timer.reference_clock_mhz)
    method = timer.method(mode, n_sets, run.stop_reason)
    method += (f"; rule >= {rule.min_samples} samples, >= {rule.min_time_s:g} s, "
               f"target {rule.target_rel_noise:.2%}")
    if run.dropped_invalid:
        method += f"; {run.dropped_invalid} samples dropped (hold expired)"
    if not run.samples_ms:
        method += "; no valid sample"
    return to_timing(run, mode=mode, method=method)


def time_callable(fn: Callable[[], Any], *, mode: str = "cold", rule: StopRule | None = None,
                  hold: bool = True) -> Timing:
    """`measure` for a plain zero-argument callable (calibration, ad-hoc timing)."""
    return measure(lambda _i: fn(), mode=mode, rule=rule, hold=hold)
