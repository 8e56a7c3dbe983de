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

import time
from collections.abc import Callable
from typing import Any

from harness.core.candidate import Candidate
from harness.submissions.diagnostics import strip_paths
from harness.submissions.scoring import (
    Progress,
    ScoreReport,
    _diagnosed,
    check_cases,
    context_usable,
    sanitized,
    score_candidate,
    time_pass,
)
from harness.submissions.timed import CASE_LISTS, CallTimer, ScoringOptions, make_timer


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
    from harness.runs.grid_cases import resolve_grid

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

    cases = options.correctness_cases or resolve_grid(
        options.correctness_grid).for_candidate(candidate)
    report = check_cases(
        cases, lambda case: check_backward_case(candidate, case, device=device, secret=secret,
                                                repeats=max(1, options.race_repeats)),
        options=options, detail=detail, progress=progress, over_budget=over_budget,
        stage="check-bwd", what="backward ", who="the backward")
    if report is not None:
        return _diagnosed(report, sanitizer, progress) if report.verdict == "crashed" \
            else report
    if sanitizer is not None:
        report = sanitized(sanitizer, progress, detail, backward=True)
        if report is not None:
            return report

    if baseline is None:
        from harness.candidates.registry import get_candidate

        baseline = get_candidate(options.baseline)
    perf_cases = options.perf_bwd_cases or list(resolve_grid(options.perf_bwd_grid).cases)
    if options.max_perf_cases is not None:
        perf_cases = perf_cases[:options.max_perf_cases]
    return time_pass(candidate, baseline, perf_cases, options, secret=secret,
                     timer=timer or make_timer(device), progress=progress, detail=detail,
                     over_budget=over_budget, backward=True)
