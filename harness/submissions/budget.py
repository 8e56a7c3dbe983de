"""One time and memory budget for validating a submission (harness.submissions.submit).

Every step of validation draws on the same budget: reading the manifest, evaluating the
launch expressions at every case of the scoring grids, the preprocessor passes and the
compiles. When it runs out the submission is refused with a message saying which step was
stopped; nothing about a submission can make its validation last longer.

* Time: `VALIDATION_BUDGET_S` seconds of wall clock from the start of validation. The
  steps in this process check the deadline between steps and at every case of the launch
  limits; each compiler run in the sandbox gets what remains as its wall-clock and CPU
  limit (and is killed at it).
* Memory: each compiler run is held to `VALIDATION_MEMORY_BYTES` of address space by the
  sandbox (the sandbox's own limit: the compiles, through
  `harness.candidates.sandboxed_compile`, get that one). The steps in this process hold at most a small multiple of what the input
  limits allow (`MAX_TOTAL_BYTES` of files, and the manifest's counts: launches, size
  expressions and their nodes, tiles, flavors, options), so they need no limit of their
  own.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from harness.candidates import sandbox
from harness.submissions.sources import Rejected

# Enough for the largest shipped variant (fa3_wgmma: two nvcc runs of about a minute on a
# CI runner) with room to spare; an honest submission never comes near it.
VALIDATION_BUDGET_S = 300.0
VALIDATION_MEMORY_BYTES = sandbox.Limits().memory_bytes  # 6 GiB: cicc reserves more than it uses

T = TypeVar("T")


class Budget:
    """The budget of one validation; created when it starts."""

    def __init__(self, seconds: float = VALIDATION_BUDGET_S,
                 memory_bytes: int = VALIDATION_MEMORY_BYTES):
        self.seconds = seconds
        self.memory_bytes = memory_bytes
        self._deadline = time.monotonic() + seconds
        self.binding = False

    def remaining(self) -> float:
        return self._deadline - time.monotonic()

    def exceeded(self, step: str) -> Rejected:
        return Rejected(f"validation stopped during {step}: checking a submission may take "
                        f"at most {self.seconds:.0f} s in all (manifest, launch limits, "
                        f"preprocessing and compiles together)")

    def check(self, step: str) -> None:
        """Refuse when the time is spent (call between steps)."""
        if self.remaining() <= 0:
            raise self.exceeded(step)

    def each(self, items: Iterable[T], step: str) -> Iterator[T]:
        """`items`, checking the deadline before each one (a loop's budget)."""
        for item in items:
            self.check(step)
            yield item

    def seconds_for(self, step: str, cap_s: float) -> float:
        """The wall-clock limit of one compiler run: at most `cap_s` and what is left of
        the budget (refused when nothing is)."""
        self.check(step)
        left = self.remaining()
        # Whether the budget, not the step's own cap, is what will stop the run.
        self.binding = left < cap_s
        return max(1.0, min(cap_s, left))

    def limits(self, step: str, cap_s: float, *, output_bytes: int = 256 << 20
               ) -> sandbox.Limits:
        """The sandbox's limits for one compiler run: `seconds_for` as its wall-clock and
        CPU limit, the budget's memory."""
        wall = self.seconds_for(step, cap_s)
        return sandbox.Limits(wall_s=wall, cpu_s=max(1, int(wall)),
                              memory_bytes=self.memory_bytes, output_bytes=output_bytes)

    def stopped(self, res: sandbox.SandboxResult, step: str) -> Rejected | None:
        """The refusal for a compiler run the sandbox stopped, or None. A run stopped by
        the clock the budget set says that the budget is spent, not that the run was
        slow."""
        if not (res.timed_out or res.killed_by):
            # A compiler whose own child was stopped at the deadline (nvcc's cc1plus,
            # killed by the CPU limit the budget set: "CPU time limit exceeded") exits
            # with an error of its own. The CPU limit is the wall limit in whole seconds,
            # so that child dies up to a second before the deadline: a failure with at
            # most that much (and a margin) left is the budget's.
            if self.binding and res.returncode not in (0, None) and self.remaining() <= 1.5:
                return self.exceeded(step)
            return None
        if res.killed_by in ("wall clock", "cpu") and self.binding:
            return self.exceeded(step)
        return Rejected(f"{step} stopped: over the {res.killed_by or 'wall clock'} limit of "
                        f"the sandbox")
