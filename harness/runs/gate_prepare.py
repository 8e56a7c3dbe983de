"""The prepare phase of `fa-harness ci` (harness.runs.gate_run): what it warms up, how
it splits correctness, which sanitizer tier it runs."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.core.cases import Case
from harness.runs.gate_options import GateOptions, GateUsageError
from harness.runs.grid_cases import GridCases, cases_of, per_candidate, resolve_grid
from harness.runs.plan import Plan


@dataclass
class GateGrids:
    """The gate's grids, resolved as every front resolves them (harness.runs.grid_cases)."""
    check: list[GridCases]  # correctness only
    timed: list[GridCases]  # timed through the forward
    timed_bwd: list[GridCases]  # timed through the backward (perf-bwd)

    @property
    def check_cases(self) -> list[Case]:
        """The correctness grids' shared lists: what the plan estimates from."""
        return cases_of(self.check)

    def check_for(self) -> Callable[[Any], list[Case]] | None:
        """Each candidate's own correctness cases, where a grid is generated per candidate."""
        return per_candidate(self.check)

    def check_count(self, cand: Any) -> int:
        return sum(len(g.for_candidate(cand)) for g in self.check)

    def correctness_lines(self, candidates: Sequence[Any], jobs: int) -> list[str]:
        """What the gate says before its correctness pass: the pairs it runs, then
        "CANDIDATE: no case of grid NAME: why" for each candidate a per-candidate grid
        gives nothing (it would otherwise be missing from the run in silence)."""
        per = self.check_for() is not None
        line = (f"correctness: {sum(self.check_count(c) for c in candidates)} (candidate, "
                f"case) pair(s), generated per candidate" if per else
                f"correctness: {len(self.check_cases)} case(s) x {len(candidates)} "
                f"candidate(s)") + (f", {jobs} at a time" if jobs > 1 else "")
        return [line] + [x for g in self.check for x in g.no_case_lines(candidates)]

    @property
    def timing_cases(self) -> list[Case]:
        return cases_of(self.timed)

    @property
    def backward_pool(self) -> list[Case]:
        """Where the owned backwards' timed cases are taken from (harness.runs.plan_bwd):
        the forward's timing cases, then those of a grid timed through the backward."""
        fwd = self.timing_cases
        return fwd + [k for k in cases_of(self.timed_bwd) if k not in fwd]


def gate_grids(names: Sequence[str]) -> GateGrids:
    """`--grid`'s names resolved; an unknown one is a usage error."""
    try:
        grids = [resolve_grid(g) for g in names]
    except ValueError as exc:
        raise GateUsageError(str(exc)) from None
    return GateGrids(check=[g for g in grids if not g.timing],
                     timed=[g for g in grids if g.timing and not g.backward],
                     timed_bwd=[g for g in grids if g.timing and g.backward])


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
               *, correctness: bool = True,
               cases_for: Callable[[Any], Sequence[Any]] | None = None) -> list[Any]:
    """What `ci` will compile, as warm-up tasks (harness.execution.warmup): each CUDA
    variant's module; each Python candidate's timing sequence (`plan.wanted`) and, with
    `correctness`, the sequence of each of its correctness children (split by mask kind
    as the runner splits them, unsupported cases dropped as the runner drops them).
    `cases_for`: each candidate's own correctness cases (a per-candidate grid)."""
    from harness.execution.warmup import WarmTask

    tasks = []
    for c in candidates:
        if c.device != "cuda":
            continue
        mine = cases_for(c) if cases_for is not None else check_cases
        supported = [k for k in mine if c.supports(k) is None]
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
    from harness.runs.gate_options import timing_kw, yardstick_patterns
    from harness.runs.plan import make_plan

    opts = opts or GateOptions()
    grids = gate_grids(opts.grids)
    plan = make_plan(candidates, grids.check_cases, grids.timing_cases,
                     budget_min=opts.budget_min, min_time_s=opts.min_time_s, gpu=True,
                     owned=[c.name for c in candidates
                            if owned(c, opts.kernels or (), yardstick_patterns(opts))],
                     **timing_kw(opts))
    return warm_tasks(candidates, plan, grids.check_cases, cases_for=grids.check_for())
