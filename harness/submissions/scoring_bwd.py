"""Scoring a submission's backward, on its own (a manifest's `[backward]`).

`score_passes` scores the forward exactly as before (harness.submissions.scoring), hands
its verdict to `checkpoint` (the worker's child writes it to disk, so that a backward that
hangs or kills the process cannot take the forward's score with it), then, when the
candidate declares a backward, scores the backward with `score_backward` and attaches that
as `report.backward`: its own verdict and score, stored as the submission's "bwd" entry and
ranked on the backward board. Nothing the backward does changes the forward's report.

The backward's stages mirror the forward's:
1. Correctness on the `full` grid generated from what the submission declares, through
   `harness.core.check_grad.check_backward_case` with the worker's secret mixed into every
   input and into dO: dQ, dK and dV against the float64 gradient oracle (computed after
   the kernel ran, kept on the CPU) with the backward's tolerance rule; each case run
   `race_repeats` times and compared bitwise when the manifest declares the backward
   deterministic (and at least twice, every call judged against the oracle). Any failure:
   `incorrect`, failing cases listed; an unusable CUDA context afterwards: `crashed`, its
   message naming the sanitizer's finding when there is one (as the forward's).
2. compute-sanitizer on the backward's launches alone (harness.execution.sanitize,
   `passes=("bwd",)`), wherever the forward is sanitized (the worker passes the forward's
   stage as `sanitizer`): memcheck, racecheck, initcheck and synccheck on a few small
   cases, each called twice. A finding, or a tool that could not finish: `incorrect`; a
   missing tool is recorded as not run. The forward's launches are left out, so the
   forward's finding never becomes the backward's.
3. Speed on the `perf-bwd` grid, the submission's backward and the baseline's backward
   timed in the same run by the same routine (harness.submissions.timed_bwd: fresh secret
   inputs and dO per call, poisoned gradient buffers, a same-stream poison count, guards,
   inputs unchanged, every gradient finite, dQ rows and dK/dV keys of a secret sample
   against the float64 oracle). A failed check: `incorrect`. A time below the physical
   floor of the backward (its FLOPs and ideal bytes, harness.submissions.floor) is
   `invalid`; below the runner's measured ceilings only, the case is marked `suspicious`.
4. Score = geometric mean over the perf-bwd cases both support of baseline median /
   submission median, ranked as the forward's (full coverage first).
The same bounds as the forward, counted afresh for the backward: `slow_cut_factor` and
`gpu_budget_s`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from harness.core.candidate import Candidate
from harness.submissions.diagnostics import strip_paths
from harness.submissions.floor import device_name, floors, judge
from harness.submissions.scoring import (
    Progress,
    ScoreReport,
    _diagnosed,
    check_cases,
    context_usable,
    score_candidate,
)
from harness.submissions.timed import (
    CASE_LISTS,
    CallTimer,
    CheatDetected,
    ScoringOptions,
    make_timer,
)
from harness.submissions.timed_bwd import timed_backward_calls


def score_passes(candidate: Candidate, options: ScoringOptions, *, secret: int,
                 baseline: Candidate | None = None, progress: Progress | None = None,
                 timer: CallTimer | None = None, sanitizer: Callable[[], Any] | None = None,
                 variant_path: str | None = None,
                 checkpoint: Callable[[ScoreReport], None] | None = None) -> ScoreReport:
    """The forward's report, with the backward's attached when one is declared (module
    doc). A CUDA error with an unusable context during the forward propagates as from
    `score_candidate`; one during the backward becomes the backward's `crashed`."""
    report = score_candidate(candidate, options, secret=secret, baseline=baseline,
                             progress=progress, timer=timer, sanitizer=sanitizer,
                             variant_path=variant_path)
    if not (options.score_backward and candidate.support.backward):
        return report
    if not context_usable(options.device):
        # The forward left no usable context: nothing more runs in this process.
        report.backward = ScoreReport("crashed", "not run: the CUDA context was unusable "
                                      "after the forward")
        return report
    if checkpoint is not None:
        checkpoint(report)
    stage = ["backward"]

    def track(st: str, case: str) -> None:
        stage[0] = f"{st} {case}".strip()
        if progress is not None:
            progress(st, case)

    bwd_sanitizer = (backward_sanitizer(candidate, options, variant_path)
                     if sanitizer is not None else None)
    try:
        report.backward = score_backward(candidate, options, secret=secret,
                                         baseline=baseline, progress=track, timer=timer,
                                         sanitizer=bwd_sanitizer)
    except Exception as e:  # noqa: BLE001 - the backward's fault is the backward's verdict
        from harness.core.faults import is_cuda_fatal

        text = (str(e).strip().splitlines() or [""])[0][:1000]
        report.backward = ScoreReport("crashed", f"{type(e).__name__} during {stage[0]}: "
                                      f"{text}")
        if is_cuda_fatal(text):  # the sanitizer names the access, as for the forward
            report.backward = _diagnosed(report.backward, bwd_sanitizer, progress)
    _public(report.backward)
    return report


def backward_sanitizer(candidate: Candidate, options: ScoringOptions,
                       variant_path: str | None) -> Callable[[], Any] | None:
    """The backward's sanitizer stage (module doc, stage 2): the tools on the backward's
    launches alone, as the forward's stage runs them (in the sandbox-built cubin)."""
    if variant_path is None:
        return None
    from harness.execution import sanitize as san

    def run() -> Any:
        return san.sanitize(variant_path, candidate.support, san.source_names(candidate),
                            timeout_s=options.sanitize_timeout_s, passes=("bwd",))
    return run


def _sanitized(sanitizer: Callable[[], Any], progress: Progress,
               detail: dict[str, Any]) -> ScoreReport | None:
    """Stage 2 of the module doc: None when clean (or the tool is missing), else the
    verdict that ends scoring."""
    progress("sanitize", "backward")
    rep = sanitizer()
    detail["sanitizer"] = rep.to_dict()
    bad = rep.finding or rep.unchecked
    if bad is None:
        return None
    msg = (bad.summary if rep.finding is not None else
           f"compute-sanitizer {bad.tool} could not check the backward "
           f"({bad.summary or bad.status}); it is not scored unchecked")
    return ScoreReport("incorrect", f"backward: {msg}", detail=detail,
                       failing_cases=[{"case": "compute-sanitizer", "status": "failed",
                                       "message": msg}])


def _public(report: ScoreReport) -> None:
    """The backward's messages as the submitter sees them: no folder of this machine (a
    raised exception's message and frame name the harness's files)."""
    report.message = strip_paths(report.message)
    for f in report.failing_cases:
        if isinstance(f.get("message"), str):
            f["message"] = strip_paths(f["message"])


def score_backward(candidate: Candidate, options: ScoringOptions, *, secret: int,
                   baseline: Candidate | None = None, progress: Progress | None = None,
                   timer: CallTimer | None = None,
                   sanitizer: Callable[[], Any] | None = None) -> ScoreReport:
    """The backward's verdict and score (module doc); never raises for the candidate's
    fault short of an unusable CUDA context. `sanitizer`: the backward's sanitizer stage
    (`backward_sanitizer`), None where compute-sanitizer does not run."""
    from harness.core.check_grad import check_backward_case
    from harness.core.grids import cases_for, get_grid

    progress = progress or (lambda _s, _c: None)
    device = options.device
    detail: dict[str, Any] = {
        "pass": "bwd", "gpu_budget_s": options.gpu_budget_s,
        "options": {k: v for k, v in options.to_dict().items() if k not in CASE_LISTS},
        "sanitizer": {"status": "not run",
                      "reason": "compute-sanitizer does not run on this worker"}}
    started = time.monotonic()

    def over_budget() -> bool:
        detail["gpu_s"] = round(time.monotonic() - started, 1)
        return options.gpu_budget_s is not None and detail["gpu_s"] >= options.gpu_budget_s

    cases = options.correctness_cases or cases_for(options.correctness_grid, candidate)
    report = check_cases(
        cases, lambda case: check_backward_case(candidate, case, device=device, secret=secret,
                                                repeats=max(1, options.race_repeats)),
        options=options, detail=detail, progress=progress, over_budget=over_budget,
        stage="check-bwd", what="backward ", who="the backward")
    if report is not None:
        return _diagnosed(report, sanitizer, progress) if report.verdict == "crashed" \
            else report
    if sanitizer is not None:
        report = _sanitized(sanitizer, progress, detail)
        if report is not None:
            return report

    if baseline is None:
        from harness.candidates.registry import get_candidate

        baseline = get_candidate(options.baseline)
    perf_cases = options.perf_bwd_cases or get_grid(options.perf_bwd_grid)
    if options.max_perf_cases is not None:
        perf_cases = perf_cases[:options.max_perf_cases]
    return _time_backward(candidate, baseline, perf_cases, options, secret=secret,
                          timer=timer or make_timer(device), progress=progress,
                          detail=detail, over_budget=over_budget)


def _unsupported(cand: Candidate, case: Any) -> str | None:
    if not cand.support.backward:
        return f"{cand.name} declares no backward"
    return cand.supports(case) or cand.supports_backward(case)


def _time_backward(candidate: Candidate, baseline: Candidate, perf_cases: list[Any],
                   options: ScoringOptions, *, secret: int, timer: CallTimer,
                   progress: Progress, detail: dict[str, Any],
                   over_budget: Callable[[], bool]) -> ScoreReport:
    """Stage 2 and 3 of the module doc."""
    device = options.device
    detail["timing_method"] = timer.method()
    gpu = device_name(device)
    per_case: list[dict[str, Any]] = []
    unsupported: list[str] = []
    speedups: list[float] = []
    suspicious: list[dict[str, Any]] = []
    cut: str | None = None
    for case in perf_cases:
        reason = _unsupported(candidate, case) or _unsupported(baseline, case)
        if reason:
            unsupported.append(f"{case.id}: {reason}")
            continue
        if over_budget():
            cut = f"the job's GPU budget of {options.gpu_budget_s:g} s was reached"
            break
        fl = floors(case, options, gpu, backward=True)
        progress("perf-bwd-baseline", case.id)
        try:
            base_t = timed_backward_calls(baseline, case, secret=secret, timer=timer,
                                          options=options, device=device)
        except CheatDetected as e:  # the runner's fault, not the submission's
            return ScoreReport("crashed", f"baseline {baseline.name}'s backward failed its "
                               f"own checks: {e}", detail=detail, status="error")
        progress("perf-bwd", case.id)
        limit = (base_t.median_ms * options.slow_cut_factor
                 if base_t.median_ms and options.slow_cut_factor else None)
        try:
            sub_t = timed_backward_calls(candidate, case, secret=secret, timer=timer,
                                         options=options, device=device, cut_above_ms=limit)
        except CheatDetected as e:
            detail["perf"] = per_case
            return ScoreReport("incorrect", str(e), detail=detail, failing_cases=[
                {"case": case.id, "status": "failed", "message": str(e)[:2000]}])
        entry: dict[str, Any] = {
            "case": case.id, "floors": fl.to_dict(), "baseline_median_ms": base_t.median_ms,
            "median_ms": sub_t.median_ms, "min_ms": sub_t.min_ms,
            "rel_noise": sub_t.rel_noise, "samples": len(sub_t.samples_ms),
            "checked_calls": sub_t.checked_calls}
        per_case.append(entry)
        if not sub_t.samples_ms or not base_t.samples_ms or not sub_t.median_ms:
            detail["perf"] = per_case
            return ScoreReport("invalid", f"{case.id}: no valid timing sample", detail=detail)
        fv = judge(sub_t.min_ms, fl, options.floor_slack) if sub_t.min_ms is not None else None
        if fv is not None and fv.verdict == "invalid":
            detail["perf"] = per_case
            return ScoreReport("invalid", f"{case.id}: {fv.message}", detail=detail,
                               failing_cases=[{"case": case.id, "status": "invalid",
                                               "message": fv.message}])
        if fv is not None and fv.verdict == "suspicious":
            entry["suspicious"] = True
            suspicious.append({"case": case.id, "message": fv.message})
        speedup = float(base_t.median_ms or 0.0) / sub_t.median_ms
        entry["speedup"] = speedup
        speedups.append(speedup)
        if limit is not None and sub_t.median_ms > limit:
            cut = (f"{1 / speedup:.0f}x slower than {baseline.name}'s backward on {case.id}, "
                   f"over the {options.slow_cut_factor:g}x cut")
            break
    over_budget()  # the GPU seconds used, up to date
    detail.update(perf=per_case, floor_gpu=gpu,
                  coverage={"timed": len(speedups), "of": len(perf_cases),
                            "unsupported": unsupported})
    if suspicious:
        detail["suspicious"] = suspicious
    if cut is not None:
        detail["cut_short"] = cut
    if not speedups or any(s <= 0 for s in speedups):
        return ScoreReport("incorrect", "no perf-bwd case could be timed (the backward or "
                           f"the baseline {baseline.name}'s supports none)", detail=detail)
    score = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    marked = (f"; suspicious: {len(suspicious)} case(s) faster than this runner's measured "
              f"ceilings (first {suspicious[0]['case']})" if suspicious else "")
    if cut is not None:
        marked += f"; timing cut short ({cut}): scored from the cases measured"
    return ScoreReport("scored", f"backward: geometric mean speedup {score:.3f}x over "
                       f"{baseline.name}'s backward on {len(speedups)}/{len(perf_cases)} "
                       f"perf-bwd cases{marked}", score=score, detail=detail)
