"""What `fa-harness ci` is asked to do (`GateOptions`), and the gate's constants: shared by
the run (harness.records.gate_run) and the finish (harness.records.gate)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.records.compare import DEFAULT_POLICY, Policy
from harness.records.plan import (
    BASELINE,
    DEFAULT_BUDGET_MIN,
    DEFAULT_MIN_TIME_S,
    DEFAULT_TIMING_CASES,
    DEFAULT_TIMING_MIN,
)

__all__ = ["BASELINE", "DEFAULT_GRIDS", "GateNotMeasured", "GateOptions", "GateUsageError",
           "SANITIZE_TIERS", "TIMING_GRIDS"]

# Grids whose purpose is timing; without a GPU they are reported as not run.
TIMING_GRIDS = frozenset({"perf", "decode"})
DEFAULT_GRIDS = ("smoke", "perf", "decode")
SANITIZE_TIERS = ("fast", "full", "none")
# A case that hangs costs its candidate this much once (harness.execution.isolate stops
# the candidate there), not the budget.
DEFAULT_CASE_TIMEOUT_S = 60.0


class GateUsageError(ValueError):
    """Bad gate input (unknown grid or kernel): exit code 2."""


class GateNotMeasured(RuntimeError):
    """Nothing can be measured here, found before anything ran (`--require-gpu` on a
    runner without a working GPU): exit code 3, one line."""


@dataclass
class GateOptions:
    grids: list[str] = field(default_factory=lambda: list(DEFAULT_GRIDS))
    kernels: list[str] | None = None  # names or globs
    db_url: str | None = None
    baseline_branch: str = "main"
    window: int = 5
    summary: Path | None = None
    record_path: Path | None = None
    spool_dir: Path | None = None
    secret: int = 0
    source: str = "ci"
    policy: Policy = DEFAULT_POLICY
    budget_min: float = DEFAULT_BUDGET_MIN
    min_time_s: float = DEFAULT_MIN_TIME_S
    timeout_s: float = DEFAULT_CASE_TIMEOUT_S
    # A stored run (id, uuid, "latest") to compare with instead of the parent/branch rule.
    baseline_run: str | None = None
    # Fail (exit 3) at once on a runner without a working GPU.
    require_gpu: bool = False
    # The sanitizer tier: "fast", "full", "none"; None: "fast" where compute-sanitizer
    # and a GPU exist, else not run (said so).
    sanitize: str | None = None
    # Child processes side by side for the warm-up, correctness and the sanitizer
    # (None: one per CPU core on a GPU runner, 1 without a GPU).
    jobs: int | None = None
    # The floor and target of timed cases per owned candidate (None: [tool.fa-harness]
    # timing-min / timing-cases, else 8 / 16); a manifest's timing_min/timing_cases win.
    timing_min: int | None = None
    timing_cases: int | None = None
    # `--bisect`: minutes for bisecting the ranged alerts this run opened
    # (harness.records.bisect_run.bisect_after_gate); None: not asked.
    bisect_minutes: float | None = None


def default_timing(opts: GateOptions) -> tuple[int, int]:
    """(floor, target) of timed cases per owned candidate for this run."""
    from harness.candidates.project import project_setting

    lo = opts.timing_min if opts.timing_min is not None else \
        project_setting("timing-min", DEFAULT_TIMING_MIN)
    hi = opts.timing_cases if opts.timing_cases is not None else \
        project_setting("timing-cases", DEFAULT_TIMING_CASES)
    return lo, max(lo, hi)
