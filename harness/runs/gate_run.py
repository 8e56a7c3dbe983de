"""The run half of `fa-harness ci`: choose the candidates, plan, prepare, time.

1. **Choose.** Every candidate discovered (or those `--kernels` names or globs match),
   each marked owned or yardstick (harness.candidates.registry.owned), each with where
   it came from; a source that gave nothing is said so.
2. **Plan** (harness.runs.plan): owned candidates' floors first.
3. **Prepare, side by side** (on a GPU runner, `jobs` child processes at a time):
   the warm-up of the Python candidates' timing sequences (harness.execution.warmup),
   correctness of every candidate (harness.execution.runner, the Python candidates split
   by mask kind), and the sanitizer tier on the owned CUDA variants
   (harness.execution.sanitize). None of it is timed, so the cores share it; its wall
   time is measured, the warm-up's apart.
4. **Re-plan and time**: the timing part planned again from the time really left (the
   floors kept whatever is left), then each candidate timed in its own child, one after
   the other (the baseline first), nothing else running.
5. **Measured?** An owned candidate that could not run here (no GPU, failed to load,
   unavailable) or got fewer timed cases than its floor is "not measured"
   (harness.runs.gate: exit code 3); so is a run with nothing of the team's to judge
   (no owned candidate, none named by --kernels), said at once, before anything runs.
"""

from __future__ import annotations

import fnmatch
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from harness.core.results import CaseResult, Status
from harness.records.record import environment
from harness.runs.gate_options import (
    BASELINE,
    GateNotMeasured,
    GateOptions,
    GateUsageError,
    checked_yardsticks,
    timing_kw,
)
from harness.runs.gate_prepare import gate_grids, sanitize_tier, split_python, warm
from harness.runs.plan import Plan, make_plan, replan
from harness.runs.plan_bwd import backward_checked, plan_backward
from harness.runs.run_meta import calibration_object, gpu_meta, kernel_info, plain_dict

MAX_DEFAULT_JOBS = 16
# How long the timing phase waits for all its children to be ready before it starts
# timing the first anyway (a child still starting then only starts its own turn late).
STARTUP_WAIT_S = 120.0


def gpu_state() -> tuple[bool, str]:
    """(a working CUDA GPU is here, why not): a device is visible and a tiny kernel runs."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False, "torch sees no CUDA device"
        x = torch.ones(1, device="cuda")
        if float(x.add_(1).item()) != 2.0:
            return False, "a test kernel gave a wrong answer"
    except Exception as e:  # noqa: BLE001 - a broken CUDA install means "no GPU" for the gate
        return False, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return True, ""


def gpu_present() -> bool:
    return gpu_state()[0]


def select_candidates(candidates: Sequence[Any], patterns: Sequence[str] | None) -> list[Any]:
    """The candidates `patterns` (names or shell globs) match, in discovery order; a
    pattern that matches nothing is a usage error naming the known names."""
    if not patterns:
        return list(candidates)
    unknown = [p for p in patterns
               if not any(fnmatch.fnmatchcase(c.name, p) for c in candidates)]
    if unknown:
        raise GateUsageError(f"unknown kernel(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(c.name for c in candidates)) or 'none'}")
    return [c for c in candidates if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]


@dataclass
class Execution:
    results: list[CaseResult]
    meta: dict[str, Any]
    notes: list[str]
    plan: Plan | None
    load_errors: list[str]
    case_ids: set[str]  # every case of the grids this run covered
    not_here: set[str]  # candidates selected but not runnable on this machine
    owned: list[str] = field(default_factory=list)
    not_measured: list[tuple[str, str]] = field(default_factory=list)  # (candidate, why)
    sanitizer: list[Any] = field(default_factory=list)  # SanitizeOutcome per variant
    candidates: list[Any] = field(default_factory=list)  # those run here
    calibration: Any | None = None  # the runner's, as timing used it


def _jobs(opts: GateOptions, gpu: bool) -> int:
    if opts.jobs is not None:
        return max(1, opts.jobs)
    return min(MAX_DEFAULT_JOBS, os.cpu_count() or 1) if gpu else 1


def execute(opts: GateOptions, *, log: Callable[[str], None] = print) -> Execution:
    """Choose, plan, prepare, time (the module doc)."""
    from harness.candidates import registry
    from harness.candidates.discovery import sources
    from harness.execution.report import LineReport
    from harness.execution.runner import run_correctness

    t0 = time.monotonic()
    gpu, why_no_gpu = gpu_state()
    if opts.require_gpu and not gpu:
        raise GateNotMeasured(f"--require-gpu: no working CUDA GPU here ({why_no_gpu})")
    notes: list[str] = []
    grids = gate_grids(opts.grids)
    pool = registry.discover()
    broken = registry.load_errors()
    notes += registry.notes()   # e.g. a source tree never installed: no entry points
    pats = opts.kernels or []

    def named(name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in pats)

    # A variant that failed to load is a failure of the gate, named; also when it was
    # asked for by --kernels (then it is not an unknown name).
    broken_names = {getattr(e, "variant", "") for e in broken}
    # Declared yardsticks (--yardsticks, [tool.fa-harness] yardsticks) are never the
    # team's: one that fails to load is a note, not a failure.
    yard = checked_yardsticks(opts, [c.name for c in pool] + sorted(broken_names), notes)
    gone = [e for e in broken if getattr(e, "variant", "")
            and registry.declared_yardstick(e.variant, yard)]
    notes += [f"yardstick not loaded: {e}" for e in gone]
    broken = [e for e in broken if e not in gone]
    errors = [str(e) for e in broken if not pats or named(getattr(e, "variant", ""))
              or not getattr(e, "variant", "")]
    # A pattern that only names variants that failed to load is not an unknown name.
    asked = [p for p in pats if any(fnmatch.fnmatchcase(c.name, p) for c in pool)
             or not any(fnmatch.fnmatchcase(b, p) for b in broken_names if b)]
    candidates = [] if pats and not asked else select_candidates(pool, asked or None)
    owned = [c.name for c in candidates if registry.owned(c, pats, yard)]
    # Nothing of the team's (none owned, none named but declared yardsticks, none that
    # failed to load): a green gate would have judged only yardsticks. Exit 3 with one
    # line, before anything runs.
    if not owned and (not pats or candidates) and not any(
            _broken_is_owned(e) and (not pats or named(getattr(e, "variant", "")))
            for e in broken):
        raise GateNotMeasured("nothing of the team's was found to judge: no kernel folder, "
                              "Python candidate or entry point of the team's gave a "
                              "candidate ([tool.fa-harness] kernels-dirs, candidates; "
                              "`fa-harness kernels` lists them), and no --kernels names "
                              "one to time")
    for src in sources():
        log(f"from {src.line()}")
    not_measured: list[tuple[str, str]] = []
    for e in broken:
        v = getattr(e, "variant", "")
        if v and (not pats or named(v)) and _broken_is_owned(e):
            not_measured.append((v, "failed to load"))
    not_here: set[str] = set()
    if not gpu:
        not_here = {c.name for c in candidates if c.device != "cpu"}
        candidates = [c for c in candidates if c.device == "cpu"]
        if not_here:
            notes.append(f"no GPU ({why_no_gpu}): {len(not_here)} GPU candidate(s) not run "
                         f"({', '.join(sorted(not_here))})")
        not_measured += [(n, "no GPU here") for n in sorted(not_here) if n in owned]
    for c in candidates:
        why = registry.unavailable_reason(c)
        if why and c.name in owned and c.device != "cpu":
            not_measured.append((c.name, f"unavailable: {why}"))
    if not candidates and not errors:
        raise GateUsageError("no candidate to run on this machine")
    check_cases, timing_cases = grids.check_cases, grids.timing_cases
    check_for = grids.check_for()
    timed_grids = grids.timed + grids.timed_bwd
    if timed_grids and not gpu:
        notes.append(f"grid {', '.join(g.name for g in timed_grids)}: "
                     "timing needs a GPU; not run")
    jobs = _jobs(opts, gpu)
    plan_kw = {"owned": owned, **timing_kw(opts)}
    plan = make_plan(candidates, check_cases, timing_cases, budget_min=opts.budget_min,
                     min_time_s=opts.min_time_s, gpu=gpu, parallel=jobs, **plan_kw)
    if gpu:
        plan_backward(plan, candidates, grids.backward_pool, owned=owned)
    for line in plan.lines():
        log(line)
    for err in errors:
        log(f"FAIL load error: {err}")
    tier = sanitize_tier(opts, gpu, notes)

    # --- prepare: warm-up, correctness and the sanitizer tier side by side
    results: list[CaseResult] = []
    sanitized: list[Any] = []
    side = ThreadPoolExecutor(max_workers=2)
    warm_f: Future | None = None
    san_f: Future | None = None
    if gpu:
        warm_f = side.submit(warm, candidates, plan, jobs, opts, log)
    if tier is not None:
        cuda_owned = [c for c in candidates if c.kind == "cuda" and c.name in owned]
        if cuda_owned:
            from harness.execution.sanitize import sanitize_variants

            log(f"sanitize ({tier}): {len(cuda_owned)} owned CUDA variant(s)")
            san_f = side.submit(sanitize_variants, cuda_owned, tier=tier, trusted=True,
                                parallel=max(1, jobs // 4))
    try:
        if check_cases:
            counts = {c.name: grids.check_count(c) for c in candidates}
            for line in grids.correctness_lines(candidates, jobs):
                log(line)
            report = LineReport(counts, stream=sys.stdout)
            results += run_correctness(candidates, check_cases, secret=opts.secret,
                                       timeout_s=opts.timeout_s, on_result=report,
                                       parallel=jobs, split=split_python, cases_for=check_for)
            with_bwd = backward_checked(candidates, owned)
            if with_bwd:
                log(f"backward correctness: {len(check_cases)} case(s) x {len(with_bwd)} "
                    "candidate(s)")
                report = LineReport({c.name: grids.check_count(c) for c in with_bwd},
                                    stream=sys.stdout, label=" (bwd)")
                results += run_correctness(with_bwd, check_cases, secret=opts.secret,
                                           timeout_s=opts.timeout_s, on_result=report,
                                           parallel=jobs, split=split_python, backward=True,
                                           cases_for=check_for)
        correctness_s = time.monotonic() - t0
        if warm_f is not None:
            plan.compile_took_s = warm_f.result()
        plan.correctness_took_s = time.monotonic() - t0
        if san_f is not None:
            sanitized = san_f.result()
            for o in sanitized:
                log(("FAIL " if o.failed else "ok   ") + o.line)
    finally:
        side.shutdown(wait=True)
    log(f"prepared in {time.monotonic() - t0:.0f} s (correctness {correctness_s:.0f} s"
        + (f", warm-up {plan.compile_took_s:.0f} s" if plan.compile_took_s else "") + ")")

    # --- time
    if gpu and plan.timed:
        before = {k: len(v) for k, v in plan.timed.items()}
        plan = replan(plan, candidates, timing_cases, time.monotonic() - t0, **plan_kw)
        plan_backward(plan, candidates, grids.backward_pool, owned=owned)
        after = {k: len(v) for k, v in plan.timed.items()}
        if after != before:
            log(f"re-plan: {plan.correctness_took_s:.0f} s spent; timing "
                f"{sum(after.values())} case(s), {plan.timed_s:.0f} s")
    timed_results, calibration = (_time_all(opts, candidates, plan, notes, log) if gpu
                                  else ([], None))
    if gpu and plan.timed_bwd:
        timed_results += _time_backward(opts, candidates, plan, calibration, log)
    results = _dedupe(results + timed_results)
    not_measured += _under_floor(plan, timed_results, not_measured)
    kernels = {c.name: kernel_info(c) for c in candidates}
    for name, info in kernels.items():  # the summary reports a yardstick's failures
        info["owned"] = name in owned
    env = environment()
    env["ci_plan"] = plan.to_dict()
    env["ci_plan"]["wall_s"] = round(time.monotonic() - t0, 1)
    env["ci_plan"]["owned"] = sorted(owned)
    env["ci_plan"]["jobs"] = jobs
    if not_measured:
        env["ci_not_measured"] = [{"kernel": n, "why": w} for n, w in not_measured]
    if sanitized:
        env["ci_sanitizer"] = [{"kernel": o.name, "failed": o.failed, "line": o.line,
                                "tier": tier} for o in sanitized]
    if errors:
        env["ci_load_errors"] = errors
    meta: dict[str, Any] = {"source": opts.source, "grids": list(opts.grids),
                            "kernels": kernels, "env": env}
    meta["gpu"] = gpu_meta() if gpu else None
    meta["calibration"] = plain_dict(calibration)
    ids = {c.id for c in check_cases} | ({c.id for c in grids.backward_pool} if gpu else set())
    if check_for is not None:
        ids |= {k.id for c in candidates for k in check_for(c)}
    return Execution(results, meta, notes, plan, errors, ids, not_here, owned,
                     not_measured, sanitized, list(candidates), calibration)


def _broken_is_owned(err: Any) -> bool:
    """A variant that failed to load is the team's unless it sits in the shipped folder
    of an installed fa-harness."""
    from pathlib import Path

    from harness.candidates.discovery import KERNELS_ROOT, harness_is_the_project

    try:
        inside = KERNELS_ROOT.resolve() in Path(err.path).resolve().parents
    except (OSError, ValueError):
        inside = False
    return not inside or harness_is_the_project()


def _time_all(opts: GateOptions, candidates: Sequence[Any], plan: Plan,
              notes: list[str], log: Callable[[str], None]
              ) -> tuple[list[CaseResult], Any | None]:
    """Each candidate in its own timing child: all the children start side by side (a
    child's start, torch, CUDA and the compile caches, costs seconds each), and once
    they are ready (or STARTUP_WAIT_S has passed) they are timed one after the other, the
    baseline first, then the owned ones, then the yardsticks, nothing else on the GPU.
    The re-plan before this fitted the cases to the budget. Returns the results and the
    runner's calibration used for their rooflines."""
    from harness.execution.report import LineReport
    from harness.measure.perf import add_baseline_ratios, run_perf

    order = sorted((c for c in candidates if plan.timed.get(c.name)),
                   key=lambda c: (c.name != BASELINE, c.name not in plan.minimum, c.name))
    if not order:
        return [], None
    calibration = calibration_object(notes)
    ready = {c.name: threading.Event() for c in order}
    go = {c.name: threading.Event() for c in order}

    def turn(name: str) -> Callable[[], None]:
        def wait_for_it() -> None:
            ready[name].set()
            go[name].wait()
        return wait_for_it

    out: list[CaseResult] = []
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(order)) as pool:
        futures = {}
        for c in order:
            report = LineReport({c.name: len(plan.timed[c.name])}, stream=sys.stdout,
                                label=" (timed)")
            futures[c.name] = pool.submit(
                run_perf, [c], plan.timed[c.name], calibration=calibration,
                timeout_s=opts.timeout_s, timing={"rule": {"min_time_s": opts.min_time_s}},
                log=log, on_result=report.on_result, turn=turn(c.name))
        try:
            for c in order:
                ready[c.name].wait(max(0.0, STARTUP_WAIT_S - (time.monotonic() - started)))
            log(f"timing: {len(order)} children started in {time.monotonic() - started:.0f} s")
            for c in order:
                log(f"timing {c.name} on {len(plan.timed[c.name])} case(s)")
                go[c.name].set()
                out += futures[c.name].result()
        finally:
            for ev in go.values():  # a failure above must not leave a child waiting
                ev.set()
    add_baseline_ratios(out, BASELINE)
    log(f"timed {len(out)} case(s) in {time.monotonic() - started:.0f} s")
    return out, calibration


def _time_backward(opts: GateOptions, candidates: Sequence[Any], plan: Plan,
                   calibration: Any | None, log: Callable[[str], None]) -> list[CaseResult]:
    """The backward's timing (harness.runs.plan_bwd): one child per candidate, after
    the forward's, the baseline first."""
    from harness.execution.report import LineReport
    from harness.measure.perf import add_baseline_ratios, run_perf

    out: list[CaseResult] = []
    order = sorted((c for c in candidates if plan.timed_bwd.get(c.name)),
                   key=lambda c: (c.name != BASELINE, c.name))
    for c in order:
        cases = plan.timed_bwd[c.name]
        log(f"timing {c.name} (bwd) on {len(cases)} case(s)")
        report = LineReport({c.name: len(cases)}, stream=sys.stdout, label=" (bwd, timed)")
        out += run_perf([c], cases, calibration=calibration, timeout_s=opts.timeout_s,
                        timing={"rule": {"min_time_s": opts.min_time_s}}, log=log,
                        on_result=report.on_result, backward=True)
    add_baseline_ratios(out, BASELINE)
    return out


def timed_count(results: Sequence[CaseResult], name: str, pass_name: str = "fwd") -> int:
    return sum(1 for r in results if r.kernel == name and r.status is Status.PASSED
               and r.pass_name == pass_name and r.timing is not None and r.timing.median_ms)


def _under_floor(plan: Plan, timed: Sequence[CaseResult],
                 already: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    done = {n for n, _ in already}
    out = []
    for pass_name, floors in (("fwd", plan.minimum), ("bwd", plan.minimum_bwd)):
        what = "" if pass_name == "fwd" else "backward: "
        for name, floor in sorted(floors.items()):
            n = timed_count(timed, name, pass_name)
            if name not in done and n < floor:
                out.append((name, f"{what}{n} timed case(s), fewer than its floor of {floor}"))
    return out


def _dedupe(results: list[CaseResult]) -> list[CaseResult]:
    """One result per (kernel, pass, case): a case in two grids keeps the later (timed)
    one, unless that one was skipped and the earlier one was not."""
    by_key: dict[tuple[str, str, str], CaseResult] = {}
    for r in results:
        key = (r.kernel, r.pass_name, r.case.id)
        prev = by_key.get(key)
        if prev is not None and r.status == "skipped" and prev.status != "skipped":
            continue
        by_key[key] = r
    return list(by_key.values())
