"""The prepare phase of `fa-harness ci` (harness.records.gate_run): what it warms up, how
it splits correctness, which sanitizer tier it runs."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from harness.records.gate_options import GateOptions, GateUsageError
from harness.records.plan import Plan


def sanitize_tier(opts: GateOptions, gpu: bool, notes: list[str]) -> str | None:
    """The tier this run gets: the one asked for, else "fast" where a GPU and
    compute-sanitizer are here; None (with a note) where it cannot run. Asking for a tier
    on a runner without the tool is a usage error: a gate must not pretend it checked.
    The tier runs a variant's backward launches too where it declares a backward
    (harness.execution.sanitize.variant_passes)."""
    from harness.execution.sanitize import sanitizer_path

    tier = opts.sanitize
    if tier == "none":
        return None
    if not gpu:
        if tier is not None:
            notes.append(f"--sanitize {tier}: needs a GPU; not run")
        return None
    if sanitizer_path() is None:
        if tier is not None:
            raise GateUsageError(f"--sanitize {tier}: compute-sanitizer not found (PATH, "
                                 f"next to nvcc, or FA_HARNESS_COMPUTE_SANITIZER)")
        notes.append("sanitizer tier not run: compute-sanitizer not found")
        return None
    return tier or "fast"


def split_python(cand: Any) -> Callable[[Any], Any] | None:
    """Python candidates compile a kernel per mask kind: one correctness child each."""
    if getattr(cand, "kind", "") == "python":
        return lambda case: str(case.mask)
    return None


def warm_tasks(candidates: Sequence[Any], plan: Plan, check_cases: Sequence[Any] = (),
               *, correctness: bool = True) -> list[Any]:
    """What `ci` will compile, as warm-up tasks (harness.execution.warmup): each CUDA
    variant's module; each Python candidate's timing sequence (`plan.wanted`) and, with
    `correctness`, the sequence of each of its correctness children (split by mask kind
    as the runner splits them, unsupported cases dropped as the runner drops them)."""
    from harness.execution.warmup import WarmTask

    tasks = []
    for c in candidates:
        if c.device != "cuda":
            continue
        supported = [k for k in check_cases if c.supports(k) is None]
        if c.kind == "cuda":
            probe = supported[:1] or list(plan.wanted.get(c.name) or [])[:1]
            if probe and correctness:
                tasks.append(WarmTask(c.name, probe, "compile"))
            continue
        if c.kind != "python":
            continue
        if plan.wanted.get(c.name):
            tasks.append(WarmTask(c.name, list(plan.wanted[c.name]), "timing"))
        if correctness:
            key = split_python(c)
            groups: dict[Any, list[Any]] = {}
            for k in supported:
                groups.setdefault(key(k) if key else 0, []).append(k)
            tasks += [WarmTask(c.name, g, f"correctness {m}") for m, g in groups.items()]
    return tasks


def warm(candidates: Sequence[Any], plan: Plan, jobs: int, opts: GateOptions,
          log: Callable[[str], None]) -> float:
    """The Python candidates' timing sequences, compiled before the timing (their
    correctness children compile their own, side by side); seconds."""
    from harness.execution.warmup import warm_up

    t0 = time.monotonic()
    tasks = warm_tasks(candidates, plan, correctness=False)
    if tasks:
        warm_up(tasks, parallel=max(1, min(len(tasks), jobs)), timeout_s=opts.timeout_s * 5,
                options_for=lambda _n: {"secret": opts.secret}, log=log)
    return time.monotonic() - t0


def ci_warm_tasks(candidates: Sequence[Any], opts: GateOptions | None = None) -> list[Any]:
    """Everything `fa-harness ci` with these options (default: none) will compile on this
    runner, as warm-up tasks: `fa-harness kernels --compile` runs them on a GPU."""
    from harness.candidates.registry import owned
    from harness.core.grids import get_grid
    from harness.records.gate_options import TIMING_GRIDS, default_timing, yardstick_patterns
    from harness.records.plan import make_plan

    opts = opts or GateOptions()
    check = [c for g in opts.grids if g not in TIMING_GRIDS for c in get_grid(g)]
    timing = [c for g in opts.grids if g in TIMING_GRIDS for c in get_grid(g)]
    floor, target = default_timing(opts)
    plan = make_plan(candidates, check, timing, budget_min=opts.budget_min,
                     min_time_s=opts.min_time_s, gpu=True, timing_min=floor,
                     timing_target=target,
                     owned=[c.name for c in candidates
                            if owned(c, opts.kernels or (), yardstick_patterns(opts))])
    return warm_tasks(candidates, plan, check)
