"""The stream hold's switch-off is one measurement's, not the process's (CPU: the device
timer's sampling with stand-ins for the CUDA stream, events and hold kernel).

A launch that blocks the host waits out the hold, so `DeviceTimer.sample` stops holding
the stream; the timer is shared by every measurement on the device (`DeviceTimer.get`),
so that must end with the measurement. Before, one blocking launch (a Python candidate's
first call, a submission that synchronises) left every later measurement in the process
without the hold: launch latency inside a tiny kernel's samples."""

from __future__ import annotations

import time

import torch

from harness.measure.sampling import MAX_HOLD_EXPIRIES
from harness.measure.timing import DeviceTimer


class _Event:
    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other) -> float:
        return 0.01


class _Hold:
    """Expires (as the flag-spin kernel does past its timeout) when the launch held the
    host for longer than the timeout."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.force_expiry = False   # the spin ran out although the host was not held
        self._t = 0.0
        self._expired = False

    def engage(self, stream) -> None:
        self._t = time.perf_counter()

    def release(self) -> None:
        self._expired = time.perf_counter() - self._t >= self.timeout_s

    def expired(self) -> bool:
        return self._expired or self.force_expiry


def _timer(monkeypatch, timeout_s: float = 0.02) -> DeviceTimer:
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: object())
    t = DeviceTimer.__new__(DeviceTimer)
    t.device = "cpu"
    t._flush = torch.zeros(4, dtype=torch.uint8)
    t._start, t._stop = _Event(), _Event()
    t._read_clock = None
    t._hold_kernel = _Hold(timeout_s)
    t._hold_note = "stream held by flag-spin kernel"
    return t.begin()


def test_a_blocking_launch_switches_the_hold_off_for_its_measurement_only(monkeypatch):
    timer = _timer(monkeypatch)
    fast = timer.sample(lambda i: None, 0)
    assert fast.valid and "stream held" in timer.hold_note

    blocked = timer.sample(lambda i: time.sleep(0.03), 0)
    assert not blocked.valid
    assert timer.hold_note.startswith("no hold (the launch blocks the host")
    # The rest of that measurement runs unheld: nothing can expire.
    assert timer.sample(lambda i: time.sleep(0.03), 0).valid

    timer.begin()   # the next measurement (`measure`, a perf case, a scored submission)
    assert timer.hold_note == "stream held by flag-spin kernel"
    assert timer.sample(lambda i: None, 0).valid
    assert not timer.sample(lambda i: time.sleep(0.03), 0).valid, "the hold was not back"


def test_expiries_in_a_row_are_counted_per_measurement(monkeypatch):
    # Expiries without a blocked host (a slow start of the spin, a busy GPU) give the hold
    # up after MAX_HOLD_EXPIRIES in a row; a new measurement counts from zero.
    timer = _timer(monkeypatch)
    timer._hold_kernel.force_expiry = True
    for _ in range(MAX_HOLD_EXPIRIES - 1):
        assert not timer.sample(lambda i: None, 0).valid
    assert "stream held" in timer.hold_note
    timer.begin()
    assert not timer.sample(lambda i: None, 0).valid
    assert "stream held" in timer.hold_note, "the count carried over from the last measurement"
    for _ in range(MAX_HOLD_EXPIRIES - 1):
        timer.sample(lambda i: None, 0)
    assert timer.hold_note.startswith("no hold")
