"""Timed calls of a submission, every one of them checked (harness.submissions.scoring, stage 2):
fresh secret inputs per call, poisoned harness-owned buffers, a same-stream poison count
right after the closing event, guard zones, unchanged inputs, and a random secret subset of
rows against the float64 oracle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from harness.core.buffers import POISON_BITS, InputSnapshot, OutputBuffers
from harness.core.candidate import Candidate
from harness.core.cases import Case, Inputs, derive_seed, make_inputs

# Draw indices of timed calls start here, away from the correctness draw (0).
TIMED_DRAW_BASE = 1000
SAMPLED_ROWS = 16
# Seed index of the generator that picks the oracle rows (never an input draw index).
ROW_PICK_DRAW = 1 << 40



# The options that hold explicit case lists (serialised as case dicts).
CASE_LISTS = ("correctness_cases", "perf_cases", "perf_bwd_cases")


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
    # Timing: the stopping rule of harness.measure.timing; fewer samples make a faster, noisier score.
    min_samples: int = 10
    min_time_s: float = 0.5
    max_time_s: float = 10.0
    warmup_calls: int = 2
    # A sample faster than (1 - floor_slack) x the physical (datasheet) floor is invalid;
    # the slack covers the CUDA event's resolution on microsecond cases.
    floor_slack: float = 0.02
    # The runner's measured ceilings (else its calibration): faster is `suspicious`.
    ceilings: dict[str, float] | None = None  # {"copy_gbps": .., "matmul_tflops": ..}
    # The datasheet to use instead of the runner GPU's table entry (tests, unknown GPUs):
    # {"name": .., "tflops_fp16": .., "hbm_tbps": .., "l2_bytes": .., "tflops_fp8": ..}
    # (tflops_fp8 optional: without it fp8 cases get the fp16 peak).
    datasheet: dict[str, Any] | None = None
    # Re-check suspicious cases with Nsight Compute when it is installed.
    ncu_recheck: bool = True
    # compute-sanitizer (memcheck, racecheck, initcheck, synccheck) on a few small cases
    # before timing (harness.execution.sanitize), when the tool is installed.
    sanitize: bool = True
    # Per tool; below the worker's per-case deadline, so a slow tool is this stage's
    # verdict and not a killed job.
    sanitize_timeout_s: float = 50.0
    # Runs per correctness case compared bitwise (race check), unless the manifest
    # declares the kernel nondeterministic.
    race_repeats: int = 3
    # Bounded cost per job: a submission this many times slower than the baseline on a
    # perf case has its timing cut short there (scored from what was measured), and the
    # whole job holds the GPU for at most `gpu_budget_s` (correctness past it: `timeout`;
    # timing past it: scored from the cases measured). Both are said in the message.
    slow_cut_factor: float = 50.0
    gpu_budget_s: float | None = 600.0
    # A declared backward (a manifest's `[backward]`) is scored on its own
    # (harness.submissions.scoring_bwd): correctness on `correctness_grid`, timing on
    # `perf_bwd_grid`, with this job's budget and cuts again; off only for demos.
    score_backward: bool = True
    perf_bwd_grid: str = "perf-bwd"
    # Explicit cases instead of the named grids (tests, demos).
    correctness_cases: list[Case] | None = None
    perf_cases: list[Case] | None = None
    perf_bwd_cases: list[Case] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScoringOptions:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in CASE_LISTS:
            if known.get(k) is not None:
                known[k] = [Case.from_dict(c) for c in known[k]]
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        d = asdict(self)
        for k in CASE_LISTS:
            if getattr(self, k) is not None:
                d[k] = [c.to_dict() for c in getattr(self, k)]
        return d


# ----------------------------------------------------------------------------- timers


class CallTimer(Protocol):
    """Times one call: `sample(run, check)` runs `run()` in the timed region, enqueues
    `check()` right after it on the same stream, and returns (ms, check's value, valid)."""

    def sample(self, run: Callable[[], None],
               check: Callable[[], Any]) -> tuple[float, Any, bool, float | None]: ...

    def method(self) -> str: ...


class CudaCallTimer:
    """harness.measure.timing's sample (stream hold, L2 flush, clock reading) with the call
    bracketed by its own events and the same-stream check queued behind them."""

    def __init__(self) -> None:
        from harness.measure.timing import DeviceTimer

        self.timer = DeviceTimer.get().begin()   # one per scored candidate
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
    from harness.core.reference import attention_naive, attention_ref
    from harness.core.tolerance import check_output

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
                options: ScoringOptions, device: str,
                cut_above_ms: float | None = None) -> TimedCase:
    """Time `candidate` on `case`, every call with fresh inputs and fully checked
    (module doc). Raises CheatDetected on the first failed check. `cut_above_ms`: once 3
    samples have a median above it, stop sampling (`stop_reason` says "cut short")."""
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
        where = f"timed call {calls['n']} on {case.id}"
        check_call(where, unwritten, (bufs.out,), bufs, snapshot, inputs,
                   what="output", named="the output")
        rows = pick_rows(case, inputs, gen, options.sampled_rows)
        msg = check_rows(case, inputs, bufs, candidate, rows)
        if msg:
            raise CheatDetected(f"{where}: output wrong on sampled rows: {msg}")
        return ms, valid, clock

    return sample_checked(one_call, timer=timer, options=options, cut_above_ms=cut_above_ms,
                          calls=calls)


def check_call(where: str, unwritten: Any, written: tuple[torch.Tensor, ...], bufs: Any,
               snapshot: InputSnapshot, inputs: Any, *, what: str, named: str) -> None:
    """The checks of one timed call short of the oracle, the forward's and the backward's
    alike: `unwritten` (the same-stream poison count) is zero, the guard zones and the
    inputs are untouched, every element of `written` is finite. Raises CheatDetected."""
    n_unwritten = int(unwritten)
    if n_unwritten:
        raise CheatDetected(
            f"{where}: {n_unwritten} {what} element(s) still poisoned when the check "
            f"queued right after the kernel on its stream ran (written late, on another "
            f"stream, or not at all)")
    # Every element finite (not only the sampled rows): cheap, and a NaN or Inf hidden in
    # a row the sample skips is caught on every call.
    nonfinite = sum(int((~torch.isfinite(t)).sum()) for t in written)
    problems = [p for p in (bufs.check_guards(), snapshot.changed(inputs)) if p]
    if nonfinite:
        problems.append(f"{nonfinite} non-finite element(s) in {named}")
    if problems:
        raise CheatDetected(f"{where}: " + "; ".join(problems))


def sample_checked(one_call: Callable[[int], tuple[float, bool, float | None]], *,
                   timer: CallTimer, options: ScoringOptions, cut_above_ms: float | None,
                   calls: dict[str, int]) -> TimedCase:
    """The warm-up calls, then `harness.measure.timing`'s stopping rule over `one_call(draw)`
    (one checked, timed call on the inputs of that draw index), as `timed_calls` and the
    backward's `harness.submissions.timed_bwd.timed_backward_calls` both time."""
    from harness.measure.timing import StopRule, rel_noise, sample_until_stable, to_timing

    for w in range(options.warmup_calls):
        one_call(-1 - w)  # checked like the rest; the first call may compile

    from harness.measure.timing import Sample

    def take(i: int) -> Sample:
        ms, valid, clock = one_call(i)
        return Sample(ms=ms, sm_clock_mhz=clock, valid=valid)

    rule = StopRule(min_samples=options.min_samples, min_time_s=options.min_time_s,
                    max_time_s=options.max_time_s)
    def give_up(samples: list[float]) -> str | None:
        if cut_above_ms is None or len(samples) < 3:
            return None
        med = sorted(samples)[len(samples) // 2]
        return (f"cut short: median {med:.3g} ms above {cut_above_ms:.3g} ms after "
                f"{len(samples)} samples") if med > cut_above_ms else None

    run = sample_until_stable(take, rule,
                              reference_clock_mhz=getattr(timer, "reference_clock_mhz", None),
                              give_up=give_up)
    t = to_timing(run, mode="cold", method=timer.method())
    return TimedCase(samples_ms=t.samples_ms, median_ms=t.median_ms, min_ms=t.min_ms,
                     rel_noise=rel_noise(t.samples_ms) if len(t.samples_ms) > 1 else None,
                     stop_reason=run.stop_reason, checked_calls=calls["n"])
