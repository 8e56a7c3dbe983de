"""Scoring a submitted kernel: correctness first, then speed against a baseline, with
every timed call checked.

Stages (`score_candidate`):
1. Correctness on the `full` grid generated from what the submission declares
   (`harness.runs.grid_cases.resolve_grid`, as every front resolves a grid) through
   `harness.core.check.check_case` with the worker's secret mixed into every case seed
   (a submission cannot know its inputs), each case run `race_repeats` times and
   compared bitwise unless the manifest declares the kernel
   nondeterministic, the oracle computed after the kernel ran and kept on the CPU. Any
   failure: verdict `incorrect`, failing cases listed. A crash (CUDA error) or hang ends
   the run: `crashed` / `timeout` (the hang is detected by the worker's per-case deadline);
   a crash is then run under compute-sanitizer, whose finding (the faulting access, its
   line, its distance from an allocation) joins the message.
2. compute-sanitizer (`harness.execution.sanitize`): memcheck, racecheck, initcheck and
   synccheck on a few small cases; any finding is `incorrect` with the tool's one-line
   summary; a missing tool is recorded as not run.
3. Speed on the `perf` grid. The submission and the baseline (SDPA flash by default) are
   timed in the same run by the same routine, `timed_calls`. Every timed call:
   - gets FRESH inputs, drawn before the call (outside the timed region) from the secret
     seed and a new draw index, so nothing can be cached across calls;
   - writes into harness-owned buffers poisoned just before it;
   - is bracketed by its own CUDA events inside `harness.measure.timing`'s sample (stream hold,
     L2 flush, clock filter), and right after the closing event, still on the same stream
     and before any synchronisation, a check kernel counts the elements still holding
     the poison: work left running on another stream is seen as unwritten output;
   - is then checked: that count, the guard zones, the inputs unchanged (bitwise), every
     output element finite, and the output of a random secret subset of query rows plus every fully masked row
     against the float64 oracle with the one tolerance rule (`check_output`).
   A failed check: verdict `incorrect` naming the case and the check.
   A time below the physical floor of the runner's GPU (datasheet peak and bandwidth,
   `harness.submissions.floor`) makes the submission `invalid`; below the runner's measured
   ceilings only, the case is marked `suspicious` (scored) and re-checked with Nsight
   Compute where installed (too few DRAM bytes read: `invalid`).
4. Score = geometric mean over the perf cases both support of baseline median / submission
   median. Perf cases the submission does not support are listed in `detail["coverage"]`.

Bounded cost: one slow submission must not hold the queue. A submission more than
`slow_cut_factor` (50x) slower than the baseline on a perf case has its timing cut short
there (its sampling stops after 3 samples, and no further case is timed): it is scored from
what was measured, with a message saying so, and ranks behind full-coverage entries. The
job holds the GPU for at most `gpu_budget_s`: past it in correctness the verdict is
`timeout` (not scored), past it in timing the cases measured so far are scored. The GPU
seconds used and the budget are kept in `detail["gpu_s"]` / `detail["gpu_budget_s"]` and
shown on the leaderboard.

No host code of the submission runs: the candidate is a `CudaVariant` built from CUDA
source and a declarative manifest. A declared backward is scored after all this, on its
own (harness.submissions.scoring_bwd); the worker's scorer is
harness.submissions.score_job.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from harness.core.candidate import Candidate
from harness.core.results import CaseResult, Status
from harness.submissions.floor import datasheet, device_name, floors, judge, ncu_recheck
from harness.submissions.queue import Outcome
from harness.submissions.timed import (
    CASE_LISTS,
    CallTimer,
    CheatDetected,
    ScoringOptions,
    make_timer,
    timed_calls,
)

VERDICTS = ("scored", "incorrect", "invalid", "rejected", "crashed", "timeout")
Progress = Callable[[str, str], None]  # (stage, case id)

# What scoring reports is exactly what the worker writes back for a job (verdict, message,
# score, failing cases, detail, status): one dataclass, kept in the torch-free queue module.
ScoreReport = Outcome


# ----------------------------------------------------------------------------- scoring


def context_usable(device: str) -> bool:
    """After a CUDA error: is the context still alive (a sticky error such as an illegal
    address poisons every later call), or must the run end as `crashed`?"""
    if torch.device(device).type != "cuda":
        return True
    try:
        x = torch.ones(1, device=device)
        torch.cuda.synchronize()
        return float(x.add_(1).item()) == 2.0
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return False


def _result_entry(r: CaseResult) -> dict[str, Any]:
    return {"case": r.case.id, "status": r.status.value, "message": r.message[:2000]}


def score_candidate(candidate: Candidate, options: ScoringOptions, *, secret: int,
                    baseline: Candidate | None = None, progress: Progress | None = None,
                    timer: CallTimer | None = None,
                    sanitizer: Callable[[], Any] | None = None,
                    variant_path: str | None = None) -> ScoreReport:
    """The whole scoring protocol of the module doc. Never raises for the candidate's
    fault; a CUDA error propagates as an exception only when the context is unusable
    (the worker's child turns it into `crashed`)."""
    from harness.core.check import check_case

    progress = progress or (lambda _s, _c: None)
    device = options.device
    detail: dict[str, Any] = {"options": {k: v for k, v in options.to_dict().items()
                                          if k not in CASE_LISTS},
                              "gpu_budget_s": options.gpu_budget_s}
    started = time.monotonic()

    def over_budget() -> bool:
        detail["gpu_s"] = round(time.monotonic() - started, 1)  # the GPU seconds used so far
        return options.gpu_budget_s is not None and detail["gpu_s"] >= options.gpu_budget_s

    # 1. correctness: the per-candidate full grid, each case repeated and compared bitwise
    # (race check), the oracle kept off the device.
    from harness.runs.grid_cases import resolve_grid

    cases = options.correctness_cases or resolve_grid(
        options.correctness_grid).for_candidate(candidate)
    report = check_cases(
        cases, lambda case: check_case(candidate, case, device=device, secret=secret,
                                       repeats=max(1, options.race_repeats),
                                       oracle_device="cpu"),
        options=options, detail=detail, progress=progress, over_budget=over_budget,
        stage="check", what="", who="the submission")
    if report is not None:
        return _diagnosed(report, sanitizer, progress) if report.verdict == "crashed" \
            else report

    # 2. compute-sanitizer on a few small cases, before anything is timed.
    if sanitizer is not None:
        report = sanitized(sanitizer, progress, detail, backward=False)
        if report is not None:
            return report

    # 3. speed
    if baseline is None:
        from harness.candidates.registry import get_candidate

        baseline = get_candidate(options.baseline)
    perf_cases = options.perf_cases or list(resolve_grid(options.perf_grid).cases)
    if options.max_perf_cases is not None:
        perf_cases = perf_cases[:options.max_perf_cases]
    return time_pass(candidate, baseline, perf_cases, options, secret=secret,
                     timer=timer or make_timer(device), progress=progress, detail=detail,
                     over_budget=over_budget, backward=False, variant_path=variant_path)


# --------------------------------------------------- stages shared with the backward


def sanitized(sanitizer: Callable[[], Any], progress: Progress, detail: dict[str, Any], *,
              backward: bool) -> ScoreReport | None:
    """Stage 2 (the forward's here, the backward's in harness.submissions.scoring_bwd):
    None when clean or the tool is missing, else the `incorrect` that ends scoring."""
    progress("sanitize", "backward" if backward else "")
    rep = sanitizer()
    detail["sanitizer"] = rep.to_dict()
    bad = rep.finding or rep.unchecked
    if bad is None:
        return None
    # Not a finding, but not a clean bill either: scoring it unchecked would let a kernel
    # that is slow under the tool skip the check.
    msg = (bad.summary if rep.finding is not None else
           f"compute-sanitizer {bad.tool} could not check the "
           f"{'backward' if backward else 'submission'} ({bad.summary or bad.status}); it "
           f"is not scored unchecked")
    return ScoreReport("incorrect", f"backward: {msg}" if backward else msg, detail=detail,
                       failing_cases=[{"case": "compute-sanitizer", "status": "failed",
                                       "message": msg}])


def _unsupported(cand: Candidate, case: Any, backward: bool) -> str | None:
    if backward and not cand.support.backward:
        return f"{cand.name} declares no backward"
    return cand.supports(case) or (cand.backward_unsupported(case) if backward else None)


def time_pass(candidate: Candidate, baseline: Candidate, perf_cases: list[Any],
              options: ScoringOptions, *, secret: int, timer: CallTimer, progress: Progress,
              detail: dict[str, Any], over_budget: Callable[[], bool], backward: bool,
              variant_path: str | None = None) -> ScoreReport:
    """Stage 3 of a pass: the submission and the baseline timed case by case by the same
    checked routine (`timed_calls`, or `timed_backward_calls` for the backward), judged
    against the physical floor, cut short when far slower or over budget, and scored.
    The forward and the backward differ only in what is timed and in words; the Nsight
    Compute re-check of a suspicious case reads the forward's bytes, so it is the
    forward's alone."""
    from harness.submissions.timed_bwd import timed_backward_calls

    timed = timed_backward_calls if backward else timed_calls
    grid = "perf-bwd" if backward else "perf"
    whose = f"{baseline.name}'s backward" if backward else baseline.name
    device = options.device
    detail["timing_method"] = timer.method()
    gpu = device_name(device)
    per_case: list[dict[str, Any]] = []
    unsupported: list[str] = []
    speedups: list[float] = []
    suspicious: list[dict[str, Any]] = []
    cut: str | None = None
    for case in perf_cases:
        reason = (_unsupported(candidate, case, backward)
                  or _unsupported(baseline, case, backward))
        if reason:
            unsupported.append(f"{case.id}: {reason}")
            continue
        if over_budget():
            cut = f"the job's GPU budget of {options.gpu_budget_s:g} s was reached"
            break
        fl = floors(case, options, gpu, backward=backward)
        progress(f"{grid}-baseline", case.id)
        try:
            base_t = timed(baseline, case, secret=secret, timer=timer, options=options,
                           device=device)
        except CheatDetected as e:  # the runner's fault, not the submission's
            return ScoreReport("crashed", f"baseline {whose} failed its own checks: {e}",
                               detail=detail, status="error")
        progress(grid, case.id)
        limit = (base_t.median_ms * options.slow_cut_factor
                 if base_t.median_ms and options.slow_cut_factor else None)
        try:
            sub_t = timed(candidate, case, secret=secret, timer=timer, options=options,
                          device=device, cut_above_ms=limit)
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
            mark: dict[str, Any] = {"case": case.id, "message": fv.message}
            if options.ncu_recheck and variant_path is not None and not backward:
                spec = datasheet(options, gpu)
                mark["ncu"] = ncu_recheck(candidate, case, variant_path,
                                          spec.l2_bytes if spec else 0)
                if mark["ncu"]["status"] == "failed":
                    detail["perf"] = per_case
                    msg = (f"{case.id}: Nsight Compute measured {mark['ncu']['read_bytes']} "
                           f"DRAM bytes read, fewer than the {mark['ncu']['need_read_bytes']} "
                           f"its inputs need beyond L2 ({fv.message})")
                    return ScoreReport("invalid", msg, detail=detail, failing_cases=[
                        {"case": case.id, "status": "invalid", "message": msg}])
            entry["suspicious"] = True
            suspicious.append(mark)
        speedup = float(base_t.median_ms or 0.0) / sub_t.median_ms
        entry["speedup"] = speedup
        speedups.append(speedup)
        if limit is not None and sub_t.median_ms > limit:
            cut = (f"{1 / speedup:.0f}x slower than {whose} on {case.id}, over the "
                   f"{options.slow_cut_factor:g}x cut")
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
        who = "the backward" if backward else "the submission"
        base = f"{baseline.name}'s" if backward else baseline.name
        return ScoreReport("incorrect", f"no {grid} case could be timed ({who} or the "
                           f"baseline {base} supports none)", detail=detail)
    score = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    marked = (f"; suspicious: {len(suspicious)} case(s) faster than this runner's measured "
              f"ceilings (first {suspicious[0]['case']})" if suspicious else "")
    if cut is not None:
        marked += f"; timing cut short ({cut}): scored from the cases measured"
    return ScoreReport("scored", f"{'backward: ' if backward else ''}geometric mean speedup "
                       f"{score:.3f}x over {whose} on {len(speedups)}/{len(perf_cases)} "
                       f"{grid} cases{marked}", score=score, detail=detail)


def check_cases(cases: list[Any], check: Callable[[Any], CaseResult], *,
                options: ScoringOptions, detail: dict[str, Any], progress: Progress,
                over_budget: Callable[[], bool], stage: str, what: str,
                who: str) -> ScoreReport | None:
    """The correctness stage of a pass (the forward's `check_case`, the backward's
    `check_backward_case`, each repeated and compared bitwise): None when every case
    passed or was skipped and at least one passed, else the verdict that ends scoring
    (over budget, a crash or hang, failed cases, nothing run). `what` prefixes the
    stage in messages ("backward "), `who` names what ran none of the cases."""
    failing: list[dict[str, Any]] = []
    passed = skipped = 0
    for n_checked, case in enumerate(cases):
        if over_budget():
            return ScoreReport("timeout", f"over the job's GPU budget of "
                               f"{options.gpu_budget_s:g} s during {what}correctness "
                               f"({n_checked} of {len(cases)} cases checked); not scored",
                               failing_cases=failing, detail=detail)
        progress(stage, case.id)
        r = check(case)
        if r.status is Status.SKIPPED:
            skipped += 1
            continue
        if r.status is Status.PASSED:
            passed += 1
            continue
        failing.append(_result_entry(r))
        if r.status is Status.ERROR and not context_usable(options.device):
            return ScoreReport("crashed", f"{r.case.id}: {r.message} (the CUDA context is "
                               f"unusable afterwards)", failing_cases=failing, detail=detail)
        if r.status is Status.CRASHED:
            return ScoreReport("crashed", f"{r.case.id}: {r.message}",
                               failing_cases=failing, detail=detail)
        if r.status is Status.TIMEOUT:
            return ScoreReport("timeout", f"{r.case.id}: {r.message}",
                               failing_cases=failing, detail=detail)
        if options.stop_at_first_failure:
            break
    detail["correctness"] = {"grid": options.correctness_grid, "passed": passed,
                             "skipped": skipped, "failed": len(failing)}
    if failing:
        return ScoreReport("incorrect", f"{len(failing)} {what}correctness case(s) failed, "
                           f"first {failing[0]['case']}: {failing[0]['message']}",
                           failing_cases=failing, detail=detail)
    if passed == 0:
        return ScoreReport("incorrect", f"{who} ran none of the correctness cases (it "
                           "supports none of them)", detail=detail)
    return None

def _diagnosed(report: ScoreReport, sanitizer: Callable[[], Any] | None,
               progress: Progress | None = None) -> ScoreReport:
    """A crash says only that the context died ("illegal memory access"); the sanitizer,
    in its own process (this one's context is gone), names the access: which write, at
    which line, how far from which allocation. The verdict stays `crashed`; the finding
    is added to the message and the detail. Not for a hang: it would hang there too."""
    if sanitizer is None:
        return report
    if progress is not None:
        progress("sanitize", "after the crash")
    rep = sanitizer()
    report.detail["sanitizer"] = rep.to_dict()
    if rep.finding is not None:
        report.message = f"{report.message}; compute-sanitizer: {rep.finding.summary}"
    return report
