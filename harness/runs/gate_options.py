"""What `fa-harness ci` is asked to do (`GateOptions`), and the gate's constants: shared by
the run (harness.runs.gate_run) and the finish (harness.runs.gate)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core import grids
from harness.records.compare import DEFAULT_POLICY, Policy
from harness.runs.plan import (
    BASELINE,
    DEFAULT_BUDGET_MIN,
    DEFAULT_MIN_TIME_S,
    DEFAULT_TIMING_CASES,
    DEFAULT_TIMING_MIN,
)

__all__ = ["BASELINE", "DEFAULT_GRIDS", "GateNotMeasured", "GateOptions", "GateUsageError",
           "SANITIZE_TIERS", "TIMING_GRIDS"]

# Grids whose purpose is timing; without a GPU they are reported as not run.
TIMING_GRIDS = frozenset(grids.TIMING_GRIDS)
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
    # Candidates the team declared yardsticks (names or globs): timed and reported, never
    # the team's, never a failure. None: [tool.fa-harness] yardsticks, else none.
    yardsticks: list[str] | None = None
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
    # The floor and target of timed cases per owned candidate (None: a manifest's
    # timing_min / timing_cases, else [tool.fa-harness] timing-min / timing-cases, else
    # 8 / 16). Given here (the command line), they beat a manifest's as well.
    timing_min: int | None = None
    timing_cases: int | None = None
    # `--bisect`: minutes for bisecting the ranged alerts this run opened
    # (harness.runs.bisect_run.bisect_after_gate); None: not asked.
    bisect_minutes: float | None = None
    # `--confirm-runs`: how many more times a suspect candidate is timed, each in a fresh
    # child, before the run is judged (harness.records.confirm); None: CONFIRM_RUNS
    # there; 0: never.
    confirm_runs: int | None = None


def default_timing(opts: GateOptions) -> tuple[int, int]:
    """(floor, target) of timed cases per owned candidate for this run."""
    from harness.candidates.project import project_setting

    lo = opts.timing_min if opts.timing_min is not None else \
        project_setting("timing-min", DEFAULT_TIMING_MIN)
    hi = opts.timing_cases if opts.timing_cases is not None else \
        project_setting("timing-cases", DEFAULT_TIMING_CASES)
    return lo, max(lo, hi)


def timing_kw(opts: GateOptions) -> dict[str, Any]:
    """The plan's arguments for timed cases per owned candidate (harness.runs.plan): the
    project's defaults, and what the command line set, which a manifest does not beat."""
    lo, hi = default_timing(opts)
    return {"timing_min": lo, "timing_target": hi, "forced_min": opts.timing_min,
            "forced_target": opts.timing_cases}


def checked_yardsticks(opts: GateOptions, known: list[str], notes: list[str]) -> list[str]:
    """`yardstick_patterns`, each checked against the candidates discovered (`known`,
    those that failed to load included): one of --yardsticks that names none is a usage
    error, as an unknown --kernels is; one of the pyproject's is a note (a runner may
    not have every candidate a team lists)."""
    pats = yardstick_patterns(opts)
    unknown = [p for p in pats if not any(fnmatch.fnmatchcase(n, p) for n in known)]
    if unknown and opts.yardsticks is not None:
        raise GateUsageError(f"--yardsticks: unknown candidate(s) {', '.join(unknown)}; "
                             f"`fa-harness kernels` lists them")
    if unknown:
        notes.append(f"[tool.fa-harness] yardsticks: {', '.join(unknown)} names no "
                     f"candidate here")
    return pats


def yardstick_patterns(opts: GateOptions) -> list[str]:
    """The names or globs of the candidates declared yardsticks for this run: the
    command line's, else `[tool.fa-harness] yardsticks`."""
    from harness.candidates.project import project_list

    return list(opts.yardsticks) if opts.yardsticks is not None else \
        project_list("yardsticks")
