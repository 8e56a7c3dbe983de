"""Scoring a submitted kernel: correctness first, then speed against a baseline, with
every timed call checked.

Stages (`score_candidate`):
1. Correctness on the `full` grid through `harness.check.check_case` with the worker's
   secret mixed into every case seed (a submission cannot know its inputs). Any failure:
   verdict `incorrect`, failing cases listed. A crash (CUDA error) or hang ends the run:
   `crashed` / `timeout` (the hang is detected by the worker's per-case deadline).
2. Speed on the `perf` grid. The submission and the baseline (SDPA flash by default) are
   timed in the same run by the same routine, `timed_calls`. Every timed call:
   - gets FRESH inputs, drawn before the call (outside the timed region) from the secret
     seed and a new draw index, so nothing can be cached across calls;
   - writes into harness-owned buffers poisoned just before it;
   - is bracketed by its own CUDA events inside `harness.timing`'s sample (stream hold,
     L2 flush, clock filter), and right after the closing event, still on the same stream
     and before any synchronisation, a check kernel counts the elements still holding
     the poison: work left running on another stream is seen as unwritten output;
   - is then checked: that count, the guard zones, the inputs unchanged (bitwise), every
     output element finite, and the output of a random secret subset of query rows plus every fully masked row
     against the float64 oracle with the one tolerance rule (`check_output`).
   A failed check: verdict `incorrect` naming the case and the check.
   A time below the runner's physical floor, max(flops / matmul peak, ideal bytes / copy
   bandwidth) from its measured ceilings (`harness.calibrate`; the datasheet when the
   runner has none, which only lowers the floor), makes the submission `invalid`.
3. Score = geometric mean over the perf cases both support of baseline median / submission
   median. Perf cases the submission does not support are listed in `detail["coverage"]`.

No host code of the submission runs: the candidate is a `CudaVariant` built from CUDA
source and a declarative manifest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from harness.buffers import POISON_BITS, InputSnapshot, OutputBuffers
from harness.candidate import Candidate
from harness.cases import Case, Inputs, derive_seed, make_inputs
from harness.queue import Outcome
from harness.results import CaseResult, Status

# Draw indices of timed calls start here, away from the correctness draw (0).
TIMED_DRAW_BASE = 1000
SAMPLED_ROWS = 16
# Seed index of the generator that picks the oracle rows (never an input draw index).
ROW_PICK_DRAW = 1 << 40
VERDICTS = ("scored", "incorrect", "invalid", "rejected", "crashed", "timeout")

Progress = Callable[[str, str], None]  # (stage, case id)


class CheatDetected(Exception):
    """A timed call failed one of its checks."""


@dataclass
class ScoringOptions:
    correctness_grid: str = "full"
    perf_grid: str = "perf"
    baseline: str = "sdpa_flash"
    max_perf_cases: int | None = None
    stop_at_first_failure: bool = False
    device: str = "cuda"
    sampled_rows: int = SAMPLED_ROWS
    # Timing: the stopping rule of harness.timing; fewer samples make a faster, noisier score.
    min_samples: int = 10
    min_time_s: float = 0.5
    max_time_s: float = 10.0
    warmup_calls: int = 2
    # A sample faster than (1 - floor_slack) x the physical floor is invalid. The ceilings
    # are measured, so a small slack keeps measurement noise of the ceilings themselves
    # from flagging a kernel that runs right at the roofline.
    floor_slack: float = 0.05
    ceilings: dict[str, float] | None = None  # {"copy_gbps": .., "matmul_tflops": ..}
    # Explicit cases instead of the named grids (tests, demos).
    correctness_cases: list[Case] | None = None
    perf_cases: list[Case] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScoringOptions:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in ("correctness_cases", "perf_cases"):
            if known.get(k) is not None:
                known[k] = [Case.from_dict(c) for c in known[k]]
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        d = asdict(self)
        for k in ("correctness_cases", "perf_cases"):
            if getattr(self, k) is not None:
                d[k] = [c.to_dict() for c in getattr(self, k)]
        return d


# What scoring reports is exactly what the worker writes back for a job (verdict, message,
# score, failing cases, detail, status): one dataclass, kept in the torch-free queue module.
ScoreReport = Outcome


# ----------------------------------------------------------------------------- timers


class CallTimer(Protocol):
    """Times one call: `sample(run, check)` runs `run()` in the timed region, enqueues
    `check()` right after it on the same stream, and returns (ms, check's value, valid)."""

    def sample(self, run: Callable[[], None],
               check: Callable[[], Any]) -> tuple[float, Any, bool, float | None]: ...

    def method(self) -> str: ...


class CudaCallTimer:
    """harness.timing's sample (stream hold, L2 flush, clock reading) with the call
    bracketed by its own events and the same-stream check queued behind them."""

    def __init__(self) -> None:
        from harness.timing import DeviceTimer

        self.timer = DeviceTimer.get()
        self._e0 = torch.cuda.Event(enable_timing=True)
        self._e1 = torch.cuda.Event(enable_timing=True)
        self.reference_clock_mhz = self.timer.reference_clock_mhz

    def sample(self, run: Callable[[], None],
               check: Callable[[], Any]) -> tuple[float, Any, bool, float | None]:
        holder: dict[str, Any] = {}

        def launch(_i: int) -> None:
            self._e0.record()
            run()
            self._e1.record()
            # Same stream, before any synchronisation: sees what the stream has written.
            holder["check"] = check()

        s = self.timer.sample(launch, 0, flush=True)
        torch.cuda.synchronize()
        return self._e0.elapsed_time(self._e1), holder["check"], s.valid, s.sm_clock_mhz

    def method(self) -> str:
        return self.timer.method("cold", 1, "per-call checks") + "; own events per call"


class HostCallTimer:
    """CPU candidates (tests): wall-clock around the call; the check runs right after."""

    reference_clock_mhz: float | None = None

    def sample(self, run: Callable[[], None],
               check: Callable[[], Any]) -> tuple[float, Any, bool, float | None]:
        t0 = time.perf_counter()
        run()
        ms = (time.perf_counter() - t0) * 1e3
        return ms, check(), True, None

    def method(self) -> str:
        return "host perf_counter (CPU)"


def make_timer(device: str) -> CallTimer:
    return CudaCallTimer() if torch.device(device).type == "cuda" else HostCallTimer()


# ----------------------------------------------------------------------------- checks


def _poison_value(dtype: torch.dtype) -> int:
    bits = POISON_BITS[dtype]
    size = torch.empty((), dtype=dtype).element_size()
    top = 1 << (8 * size)
    return bits - top if bits >= top >> 1 else bits


_INT = {2: torch.int16, 4: torch.int32}


def count_poison(out: torch.Tensor, lse: torch.Tensor | None) -> torch.Tensor:
    """Elements still holding the poison, as a device tensor (queued, not synchronised)."""
    n = (out.view(_INT[out.element_size()]) == _poison_value(out.dtype)).sum()
    if lse is not None:
        n = n + (lse.view(torch.int32) == _poison_value(torch.float32)).sum()
    return n


def visibility_rows(case: Case, inputs: Inputs, rows: torch.Tensor) -> torch.Tensor:
    """(B|1, 1, len(rows), Nk) boolean visibility of the given query rows."""
    device = inputs.q.device
    j = torch.arange(case.seqlen_k, device=device)[None, :]
    vis = torch.ones((1, 1, len(rows), case.seqlen_k), dtype=torch.bool, device=device)
    if case.mask.is_causal:
        vis = vis & (j <= rows.to(device)[:, None] + case.causal_offset)[None, None]
    if inputs.mask is not None:
        m = inputs.mask.to(device)
        m = m[:, :, rows.to(device), :] if m.shape[2] != 1 else m.expand(-1, -1, len(rows), -1)
        vis = vis & m
    return vis


def check_rows(case: Case, inputs: Inputs, bufs: OutputBuffers, candidate: Candidate,
               rows: torch.Tensor) -> str | None:
    """The oracle and the tolerance rule on a subset of query rows (all batches/heads)."""
    from harness.reference import attention_naive, attention_ref
    from harness.tolerance import check_output

    vis = visibility_rows(case, inputs, rows)
    idx = rows.to(inputs.q.device)
    q_rows = inputs.q.index_select(2, idx)
    ref = attention_ref(q_rows, inputs.k, inputs.v, mask=vis)
    base = attention_naive(q_rows, inputs.k, inputs.v, mask=vis)
    out = bufs.out.index_select(2, idx)
    lse = None if bufs.lse is None else bufs.lse.index_select(2, idx)
    verdict = check_output(case, out, lse, ref, base,
                           writes_lse=candidate.support.writes_lse,
                           masked_lse=candidate.support.masked_lse)
    return None if verdict.passed else verdict.message


def pick_rows(case: Case, inputs: Inputs, gen: torch.Generator, n: int) -> torch.Tensor:
    """`n` random rows (secret generator) plus every fully masked row of any batch."""
    perm = torch.randperm(case.seqlen_q, generator=gen)[:n]
    all_rows = torch.arange(case.seqlen_q)
    vis = visibility_rows(case, inputs, all_rows.to(inputs.q.device))
    masked = (~vis.any(dim=-1)).any(dim=0).flatten().nonzero().flatten().cpu()
    return torch.unique(torch.cat([perm, masked])).sort().values


# ----------------------------------------------------------------------------- timing


@dataclass
class TimedCase:
    samples_ms: list[float]
    median_ms: float | None
    min_ms: float | None
    rel_noise: float | None
    stop_reason: str
    checked_calls: int


def timed_calls(candidate: Candidate, case: Case, *, secret: int, timer: CallTimer,
                options: ScoringOptions, device: str) -> TimedCase:
    """Time `candidate` on `case`, every call with fresh inputs and fully checked
    (module doc). Raises CheatDetected on the first failed check."""
    from harness.timing import StopRule, rel_noise, sample_until_stable, to_timing

    bufs = OutputBuffers.allocate(case, device, candidate.support.writes_lse)
    gen = torch.Generator()
    # Which rows get the oracle is secret too: derived from the secret, never stored.
    gen.manual_seed(derive_seed(case, secret, draw=ROW_PICK_DRAW))
    calls = {"n": 0}

    def one_call(draw: int) -> tuple[float, bool, float | None]:
        inputs = make_inputs(case, device, secret=secret, draw=TIMED_DRAW_BASE + draw)
        snapshot = InputSnapshot.take(inputs)
        bufs.poison()
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()  # inputs and poison in place before the timed region
        ms, unwritten, valid, clock = timer.sample(
            lambda: candidate.run(case, inputs, bufs.out, bufs.lse),
            lambda: count_poison(bufs.out, bufs.lse))
        calls["n"] += 1
        n_unwritten = int(unwritten)
        where = f"timed call {calls['n']} on {case.id}"
        if n_unwritten:
            raise CheatDetected(
                f"{where}: {n_unwritten} output element(s) still poisoned when the check "
                f"queued right after the kernel on its stream ran (output written late, on "
                f"another stream, or not at all)")
        # The whole output (not only the sampled rows) must be finite: cheap, and a NaN
        # or Inf hidden in a row the sample skips is caught on every call.
        nonfinite = int((~torch.isfinite(bufs.out)).sum())
        problems = [p for p in (bufs.check_guards(), snapshot.changed(inputs)) if p]
        if nonfinite:
            problems.append(f"{nonfinite} non-finite element(s) in the output")
        if problems:
            raise CheatDetected(f"{where}: " + "; ".join(problems))
        rows = pick_rows(case, inputs, gen, options.sampled_rows)
        msg = check_rows(case, inputs, bufs, candidate, rows)
        if msg:
            raise CheatDetected(f"{where}: output wrong on sampled rows: {msg}")
        return ms, valid, clock

    for w in range(options.warmup_calls):
        one_call(-1 - w)  # checked like the rest; the first call may compile

    from harness.timing import Sample

    def take(i: int) -> Sample:
        ms, valid, clock = one_call(i)
        return Sample(ms=ms, sm_clock_mhz=clock, valid=valid)

    rule = StopRule(min_samples=options.min_samples, min_time_s=options.min_time_s,
                    max_time_s=options.max_time_s)
    run = sample_until_stable(take, rule,
                              reference_clock_mhz=getattr(timer, "reference_clock_mhz", None))
    t = to_timing(run, mode="cold", method=timer.method())
    return TimedCase(samples_ms=t.samples_ms, median_ms=t.median_ms, min_ms=t.min_ms,
                     rel_noise=rel_noise(t.samples_ms) if len(t.samples_ms) > 1 else None,
                     stop_reason=run.stop_reason, checked_calls=calls["n"])


# ----------------------------------------------------------------------------- floor


def runner_ceilings(options: ScoringOptions, dtype: str) -> tuple[dict[str, float], str]:
    """(ceilings, where they came from): options, else the runner's calibration, else the
    datasheet of the GPU (higher than measured ceilings, so only a lower floor)."""
    if options.ceilings:
        return dict(options.ceilings), "options"
    try:
        from harness.calibrate import load_calibration

        cal = load_calibration()
    except Exception:  # noqa: BLE001 - no calibration module or file: fall back below
        cal = None
    if cal is not None:
        c = cal.ceilings(dtype)
        return {"copy_gbps": c.copy_gbps, "matmul_tflops": c.matmul_tflops}, "calibration"
    from harness.iomodel import GPU_SPECS

    spec = GPU_SPECS["h200"]
    return {"copy_gbps": spec.hbm_tbps * 1000, "matmul_tflops": spec.tflops_fp16}, \
        "datasheet h200 (runner not calibrated)"


def floor_ms(case: Case, ceilings: dict[str, float]) -> float:
    from harness.flops import attention_flops
    from harness.iomodel import Ceilings, ideal_bytes, roofline_floor_ms

    return roofline_floor_ms(attention_flops(case), ideal_bytes(case),
                             Ceilings.from_dict(ceilings))


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
                    timer: CallTimer | None = None) -> ScoreReport:
    """The whole scoring protocol of the module doc. Never raises for the candidate's
    fault; a CUDA error propagates as an exception only when the context is unusable
    (the worker's child turns it into `crashed`)."""
    from harness.check import check_case
    from harness.grids import get_grid

    progress = progress or (lambda _s, _c: None)
    device = options.device
    detail: dict[str, Any] = {"options": {k: v for k, v in options.to_dict().items()
                                          if k not in ("correctness_cases", "perf_cases")}}

    # 1. correctness
    cases = options.correctness_cases or get_grid(options.correctness_grid)
    failing: list[dict[str, Any]] = []
    passed = skipped = 0
    for case in cases:
        progress("check", case.id)
        r = check_case(candidate, case, device=device, secret=secret)
        if r.status is Status.SKIPPED:
            skipped += 1
            continue
        if r.status is Status.PASSED:
            passed += 1
            continue
        failing.append(_result_entry(r))
        if r.status is Status.ERROR and not context_usable(device):
            return ScoreReport("crashed", f"{r.case.id}: {r.message} (the CUDA context is "
                               f"unusable afterwards)", failing_cases=failing, detail=detail)
        if r.status in (Status.CRASHED, Status.TIMEOUT):
            return ScoreReport(r.status.value, f"{r.case.id}: {r.message}",
                               failing_cases=failing, detail=detail)
        if options.stop_at_first_failure:
            break
    detail["correctness"] = {"grid": options.correctness_grid, "passed": passed,
                             "skipped": skipped, "failed": len(failing)}
    if failing:
        return ScoreReport("incorrect", f"{len(failing)} correctness case(s) failed, first "
                           f"{failing[0]['case']}: {failing[0]['message']}",
                           failing_cases=failing, detail=detail)
    if passed == 0:
        return ScoreReport("incorrect", "the submission ran none of the correctness cases "
                           "(it supports none of them)", detail=detail)

    # 2. speed
    if baseline is None:
        from harness.registry import get_candidate

        baseline = get_candidate(options.baseline)
    perf_cases = options.perf_cases or get_grid(options.perf_grid)
    if options.max_perf_cases is not None:
        perf_cases = perf_cases[:options.max_perf_cases]
    timer = timer or make_timer(device)
    detail["timing_method"] = timer.method()
    per_case: list[dict[str, Any]] = []
    unsupported: list[str] = []
    speedups: list[float] = []
    for case in perf_cases:
        reason = candidate.supports(case) or baseline.supports(case)
        if reason:
            unsupported.append(f"{case.id}: {reason}")
            continue
        ceilings, source = runner_ceilings(options, case.dtype)
        floor = floor_ms(case, ceilings)
        progress("perf-baseline", case.id)
        try:
            base_t = timed_calls(baseline, case, secret=secret, timer=timer, options=options,
                                 device=device)
        except CheatDetected as e:  # the runner's fault, not the submission's
            return ScoreReport("crashed", f"baseline {baseline.name} failed its own checks: "
                               f"{e}", detail=detail, status="error")
        progress("perf", case.id)
        try:
            sub_t = timed_calls(candidate, case, secret=secret, timer=timer, options=options,
                                device=device)
        except CheatDetected as e:
            failing.append({"case": case.id, "status": "failed", "message": str(e)[:2000]})
            return ScoreReport("incorrect", str(e), failing_cases=failing, detail=detail)
        entry = {"case": case.id, "floor_ms": floor, "ceilings": ceilings,
                 "ceilings_source": source, "baseline_median_ms": base_t.median_ms,
                 "median_ms": sub_t.median_ms, "min_ms": sub_t.min_ms,
                 "rel_noise": sub_t.rel_noise, "samples": len(sub_t.samples_ms),
                 "checked_calls": sub_t.checked_calls}
        per_case.append(entry)
        if not sub_t.samples_ms or not base_t.samples_ms:
            return ScoreReport("invalid", f"{case.id}: no valid timing sample", detail=detail)
        limit = floor * (1.0 - options.floor_slack)
        if sub_t.min_ms is not None and sub_t.min_ms < limit:
            detail["perf"] = per_case
            failing.append({"case": case.id, "status": "invalid",
                            "message": f"{sub_t.min_ms:.4f} ms < floor {floor:.4f} ms"})
            return ScoreReport(
                "invalid", f"{case.id}: measured {sub_t.min_ms:.4f} ms, below the physical "
                f"floor of this runner {floor:.4f} ms (max of FLOPs / {ceilings['matmul_tflops']:.0f}"
                f" TFLOP/s and ideal bytes / {ceilings['copy_gbps']:.0f} GB/s, {source})",
                failing_cases=failing, detail=detail)
        speedup = base_t.median_ms / sub_t.median_ms
        entry["speedup"] = speedup
        speedups.append(speedup)
    detail["perf"] = per_case
    detail["coverage"] = {"timed": len(speedups), "of": len(perf_cases),
                          "unsupported": unsupported}
    if not speedups:
        return ScoreReport("incorrect", "no perf case could be timed (the submission or the "
                           f"baseline {baseline.name} supports none)", detail=detail)
    score = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    return ScoreReport("scored", f"geometric mean speedup {score:.3f}x over {baseline.name} "
                       f"on {len(speedups)}/{len(perf_cases)} perf cases", score=score,
                       detail=detail)


def score_files(files: dict[str, str], options: ScoringOptions, *, secret: int,
                progress: Progress | None = None) -> ScoreReport:
    """Build the submission from its files (CUDA source + manifest only) and score it."""
    import shutil
    import tempfile
    from pathlib import Path

    from harness.submit import Rejected, load_candidate

    if torch.device(options.device).type == "cuda" and not torch.cuda.is_available():
        return ScoreReport("crashed", "this worker has no usable CUDA GPU; the submission "
                           "was not run", status="error")
    workdir = Path(tempfile.mkdtemp(prefix="fa-score-"))
    try:
        try:
            candidate = load_candidate(files, workdir)
        except Rejected as e:
            return ScoreReport("rejected", str(e))
        return score_candidate(candidate, options, secret=secret, progress=progress)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
