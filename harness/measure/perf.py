"""The perf run: every capable candidate (our variants and the SDPA peers) timed on the
same cases in the same run, each in its own child process, each checked for correctness
once before it is timed.

Per (candidate, case) the result carries: the timing (harness.measure.timing, cold by default),
TFLOP/s from `harness.core.flops.attention_flops`, the IO model's bytes for the candidate's
algorithm and tiles plus the ideal bytes (Q, K, V, O once), optionally Nsight Compute's
measured DRAM bytes, and in `extra`:
  vs_baseline     baseline median / this median (> 1: faster than the baseline)
  roofline_tflops min(matmul ceiling, ideal intensity x copy bandwidth), from the
                  runner's measured ceilings (the `calibration` given, else this runner's
                  saved `fa-harness calibrate` file), else the datasheet of a known GPU
                  (then `ceilings` says "datasheet")
  roofline_pct    achieved TFLOP/s / roofline_tflops
  model_gbps      IO-model bytes / time
  kv_gbps         K + V bytes / time (decode shapes, Nq <= 16: bandwidth-bound)
A candidate that fails the check, crashes or hangs while sampling is one clear line on
the log and a non-passed result; the run goes on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from harness.core.candidate import Candidate
from harness.core.cases import Case, Inputs
from harness.core.results import CaseResult, Status, Timing

# Defined beside the timing method, since the backward's timing (perf_bwd) needs it too;
# the benches import it from here.
from harness.measure.timing import timing_sets

DECODE_MAX_SEQLEN_Q = 16
DEFAULT_CASE_TIMEOUT_S = 300.0


class PerfUnavailable(RuntimeError):
    """The perf run cannot happen here (no GPU); the message is one line."""


# ---------------------------------------------------------------- in the child


def output_buffers(candidate: Candidate, case: Case, device: str = "cuda"):
    """Plain output tensors for timing (the poisoned, guarded ones are for the check)."""
    import torch

    from harness.core.serving import tensor_shapes

    shape = tensor_shapes(case)["out"]  # q's shape in the case's layout (packed for varlen)
    out = torch.empty(shape, dtype=case.torch_dtype, device=device)
    lse = (torch.empty(shape[:3], dtype=torch.float32, device=device)
           if candidate.support.writes_lse else None)
    return out, lse


# Spacer sizes, in the allocator's 512-byte steps: up to 512 kB in the small pool (where
# PyTorch's caching allocator puts tensors of at most 1 MB: q, out, lse of most cases) and
# 1-3 MB in the large pool (k and v), so that each shifts the next tensors of its pool.
_SPACER_STEP = 512
_SMALL_SPACER_STEPS = 1024
_LARGE_SPACER_MIN = 1 << 20
_LARGE_SPACER_STEPS = 4096


def placed_sets(candidate: Candidate, case: Case, n: int, *, secret: int = 0,
                seed: int | None = None, device: str = "cuda"
                ) -> tuple[list[Inputs], list[tuple[Any, Any]], list[Any]]:
    """`n` input sets for timing, each with its own output buffers and each behind two
    spacers of random size: (sets, outputs, spacers); keep the spacers alive while timing.

    Why: where a kernel's buffers lie decides some kernels' speed. On the H200 the
    teaching `template` kernel on a decode case timed at 0.918 ms on one placement and at
    0.953 ms on 9 of 10 others, each placement steady to 0.1%
    (`bench/retiming_noise.py`, docs/regressions.md). With one placement per timing that
    was drawn once per run and made the run-to-run spread; with a placement per input set
    the rotation of the sets (the timing method) samples the placements, and a timing's
    median is a median over them."""
    import random

    import torch

    from harness.core.cases import make_inputs

    rng = random.Random(seed)
    spacers: list[Any] = []
    sets: list[Inputs] = []
    outputs: list[tuple[Any, Any]] = []
    for i in range(n):
        small = rng.randrange(1, _SMALL_SPACER_STEPS + 1) * _SPACER_STEP
        large = _LARGE_SPACER_MIN + rng.randrange(0, _LARGE_SPACER_STEPS) * _SPACER_STEP
        for size in (small, large):
            spacers.append(torch.empty(size, dtype=torch.uint8, device=device))
        sets.append(make_inputs(case, device, secret=secret, draw=i))
        outputs.append(output_buffers(candidate, case, device))
    return sets, outputs, spacers


def make_launch(candidate: Candidate, case: Case, input_sets: Sequence[Inputs], out, lse,
                outputs: Sequence[tuple[Any, Any]] | None = None) -> Callable[[int], Any]:
    """launch(i) runs the candidate on input set i, writing `out` and `lse`, or with
    `outputs` (one (out, lse) per set, `placed_sets`) that set's own. A candidate may offer
    `timed_call` (the SDPA peers do) to leave harness-side work, such as copying into
    `out`, out of the timed region."""
    sets = list(input_sets)
    outs = list(outputs) if outputs is not None else [(out, lse)] * len(sets)
    if len(outs) != len(sets):
        raise ValueError(f"{len(outs)} output buffers for {len(sets)} input sets")
    timed = getattr(candidate, "timed_call", None)
    if timed is not None:
        calls = [timed(case, inp, o, lz) for inp, (o, lz) in zip(sets, outs, strict=True)]
        return lambda i: calls[i]()
    return lambda i: candidate.run(case, sets[i], *outs[i])


def time_case(candidate: Candidate, case: Case, *, mode: str = "cold",
              n_sets: int | None = None, rule: dict | None = None, secret: int = 0,
              hold: bool = True, placements: bool = True) -> Timing:
    """Time `candidate` on `case` with the timing method (fresh tensors on the GPU). With
    `placements` (the default) every input set has its own outputs and its own place in
    memory (`placed_sets`); without, the sets share one pair of output buffers and lie
    wherever the allocator puts them one after the other."""
    from harness.core.cases import make_inputs
    from harness.core.iomodel import ideal_bytes
    from harness.measure.timing import StopRule, measure

    n = n_sets or timing_sets(ideal_bytes(case), mode)
    stop = StopRule(**rule) if rule else None
    if placements:
        sets, outputs, spacers = placed_sets(candidate, case, n, secret=secret)
        launch = make_launch(candidate, case, sets, None, None, outputs=outputs)
        timing = measure(launch, n_sets=n, mode=mode, rule=stop, hold=hold)
        del spacers
        return timing
    sets = [make_inputs(case, "cuda", secret=secret, draw=i) for i in range(n)]
    out, lse = output_buffers(candidate, case)
    launch = make_launch(candidate, case, sets, out, lse)
    return measure(launch, n_sets=n, mode=mode, rule=stop, hold=hold)


def kv_bytes(case: Case) -> int:
    """K + V bytes the query rows see: every key of every batch entry for a dense case;
    for windows and the serving layouts, each sequence's keys some row sees (a varlen
    decode batch's caches have mixed lengths)."""
    per_key = 2 * case.kv_heads * case.head_dim * case.torch_dtype.itemsize
    if not (case.is_serving or case.has_window):
        return case.batch * case.seqlen_k * per_key
    from harness.core.serving import keys_touched, sequence_lengths

    return sum(keys_touched(case, q, k) for q, k in sequence_lengths(case) if q) * per_key


def is_decode(case: Case) -> bool:
    return case.seqlen_q <= DECODE_MAX_SEQLEN_Q


def ceilings_for(case: Case, calibration: Any | None, gpu_key: str | None = None):
    """(Ceilings-like spec, label) for the roofline of `case`, or (None, reason)."""
    from harness.core import iomodel

    if calibration is not None:
        return calibration.ceilings(case.dtype), "measured"
    for name, spec in iomodel.GPU_SPECS.items():
        if gpu_key and name in gpu_key:
            return spec, "datasheet"
    return None, "no calibration"


def annotate(res: CaseResult, calibration: Any | None = None, gpu_key: str | None = None
             ) -> None:
    """Fill TFLOP/s, GB/s and roofline numbers of a timed result (in place)."""
    from harness.core import iomodel

    t = res.timing
    if t is None or not t.median_ms:
        return
    seconds = t.median_ms * 1e-3
    if res.flops:
        res.tflops = res.flops / seconds / 1e12
    if res.bytes_model:
        res.extra["model_gbps"] = res.bytes_model / seconds / 1e9
    if is_decode(res.case):
        res.extra["kv_gbps"] = kv_bytes(res.case) / seconds / 1e9
    spec, label = ceilings_for(res.case, calibration, gpu_key)
    res.extra["ceilings"] = label
    if spec is not None and res.flops and res.bytes_ideal:
        ai = iomodel.arithmetic_intensity(res.flops, res.bytes_ideal)
        roof = iomodel.roofline_tflops(ai, spec)
        res.extra["roofline_tflops"] = roof
        if res.tflops is not None and roof > 0:
            res.extra["roofline_pct"] = 100.0 * res.tflops / roof


def check_then_time(candidate: Candidate, case: Case, options: dict[str, Any]) -> CaseResult:
    """The isolated child's work per perf case: the correctness check, then (only when it
    passed: timing a wrong answer would be meaningless) the timing method. With
    `options["pass"] == "bwd"` the same for the candidate's backward
    (harness.measure.perf_bwd: the gradient check, then the backward alone timed)."""
    from harness.core.faults import is_cuda_fatal

    check: Callable[..., CaseResult]
    time_it: Callable[..., Timing]
    if options.get("pass") == "bwd":
        from harness.core.check_grad import check_backward_case
        from harness.measure.perf_bwd import time_backward_case

        check, time_it, what = check_backward_case, time_backward_case, "backward timing"
    else:
        from harness.core.check import check_case

        check, time_it, what = check_case, time_case, "timing"
    res = check(candidate, case, device=options.get("device") or candidate.device,
                secret=int(options.get("secret", 0)), repeats=int(options.get("repeats", 1)))
    if res.status is not Status.PASSED:
        return res
    try:
        res.timing = time_it(candidate, case, **(options.get("timing") or {}))
    except Exception as e:
        res.status = Status.CRASHED if is_cuda_fatal(str(e)) else Status.ERROR
        res.message = f"{what} failed after a passing check: {type(e).__name__}: {e}"
    return res


def add_baseline_ratios(results: Sequence[CaseResult], baseline: str) -> None:
    base = {r.case: r.timing.median_ms for r in results
            if r.kernel == baseline and r.timing is not None and r.timing.median_ms}
    for r in results:
        b = base.get(r.case)
        if b and r.timing is not None and r.timing.median_ms:
            r.extra["vs_baseline"] = b / r.timing.median_ms


# ---------------------------------------------------------------- the run


def _isolation_options(candidate: Candidate, mode: str, timing: dict[str, Any],
                       backward: bool = False) -> dict[str, Any]:
    from pathlib import Path

    options: dict[str, Any] = {"device": "cuda", "timing": dict(timing, mode=mode),
                               "case_fn": "harness.measure.perf:check_then_time"}
    if backward:
        options["pass"] = "bwd"
    if candidate.meta.get("factory"):
        options["factory"] = candidate.meta["factory"]
    manifest = candidate.meta.get("manifest_path")
    if candidate.kind == "cuda" and manifest:
        p = Path(manifest)
        options["variant_path"] = str(p.parent if p.name == "manifest.toml" else p)
    return options


def _saved_calibration(log: Callable[[str], None] | None = None) -> Any | None:
    """This runner's calibration file when there is one (`fa-harness calibrate`)."""
    from harness.measure.calibrate import CalibrationError, load_calibration

    try:
        return load_calibration()
    except CalibrationError as e:
        if log is not None:
            log(f"calibration not used: {e}")
        return None


def _log_line(res: CaseResult) -> str:
    first = (res.message or "").strip().splitlines()[0] if res.message else ""
    return f"{res.kernel} {res.case.id}: {res.status.value}" + (f": {first}" if first else "")


def run_perf(candidates: Sequence[Candidate], cases: Sequence[Case], *,
             baseline: str = "sdpa_flash", ncu: bool = False, mode: str = "cold",
             calibration: Any | None = None, timeout_s: float = DEFAULT_CASE_TIMEOUT_S,
             timing: dict[str, Any] | None = None,
             log: Callable[[str], None] | None = None,
             on_result: Callable[[CaseResult], None] | None = None,
             turn: Callable[[], None] | None = None,
             backward: bool = False) -> list[CaseResult]:
    """Time every candidate on every case it supports; results ordered by case, then by
    candidate. Raises PerfUnavailable without a CUDA GPU. `turn` (one candidate only):
    its timing child starts at once and runs when `turn()` returns
    (harness.execution.isolate.run_isolated). `backward`: the candidates' backward pass
    instead (harness.measure.perf_bwd); a candidate without one is skipped with that
    reason."""
    import torch

    from harness.execution.isolate import run_isolated
    from harness.measure.gpuinfo import gpu_identity

    if mode not in ("cold", "warm"):
        raise ValueError(f"timing mode must be 'cold' or 'warm', not {mode!r}")
    if not torch.cuda.is_available():
        raise PerfUnavailable("the perf run needs a CUDA GPU (torch.cuda.is_available() is "
                              "False)")
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    gpu_key = gpu_identity().model_key
    if calibration is None:
        calibration = _saved_calibration(log)
    cases = list(cases)
    by_candidate: list[list[CaseResult]] = []
    ncu_broken: str | None = None
    tag = {"pass": "bwd"} if backward else {}
    for cand in candidates:
        why = ("CPU candidate: not timed" if cand.device != "cuda" else
               "declares no backward" if backward and not cand.support.backward else None)
        if why:
            by_candidate.append([CaseResult(cand.name, c, Status.SKIPPED, why, extra=dict(tag))
                                 for c in cases])
            continue
        opts = _isolation_options(cand, mode, timing or {}, backward)
        if turn is None:
            log(f"timing {cand.name} on {len(cases)} case(s)")
        rows = run_isolated(cand.name, cases, mode="check", options=opts, timeout_s=timeout_s,
                            turn=turn)
        for res in rows:
            res.extra.update(tag)  # a crash verdict made by the parent carries the pass too
            if res.status is Status.PASSED and res.timing is not None:
                if not res.timing.median_ms:
                    res.status = Status.ERROR
                    res.message = f"no valid timing sample ({res.timing.method})"
                annotate(res, calibration, gpu_key)
            if ncu and not backward and res.status is Status.PASSED and ncu_broken is None:
                from harness.measure import ncu as ncu_mod

                m = ncu_mod.measure_bytes(cand, res.case,
                                          variant_path=opts.get("variant_path"))
                if m.ok:
                    res.bytes_measured_read = m.read_bytes
                    res.bytes_measured_write = m.write_bytes
                    res.extra["ncu_kernels"] = m.kernels
                    res.extra["ncu_time_ns"] = m.time_ns
                else:
                    res.extra["ncu_error"] = m.error
                    if m.error and ("not found" in m.error or "ERR_NVGPUCTRPERM" in m.error
                                    or "LibraryNotLoaded" in m.error):
                        ncu_broken = m.error
                        log(f"ncu: {m.error}; measured bytes left empty for this run")
            if res.status not in (Status.PASSED, Status.SKIPPED):
                log(_log_line(res))
            if on_result is not None:
                on_result(res)
        by_candidate.append(rows)
    results = [by_candidate[j][i] for i in range(len(cases)) for j in range(len(candidates))]
    add_baseline_ratios(results, baseline)
    return results
