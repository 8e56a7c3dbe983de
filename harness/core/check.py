"""Check one candidate on one case: the whole correctness protocol in one function.

Order matters:

* the candidate runs first, its repeats too: the expected output of a case does not exist
  anywhere while the candidate runs (no "stale memory" or "reuse the reference's result"
  trick). The oracle and the naive baseline are computed afterwards, on `oracle_device`
  (the CPU keeps them off the GPU entirely; scoring does that), and cached on the CPU
  between candidates of the same case. Device copies are overwritten with NaN before they
  are freed, and the allocator's cache is emptied, so freed memory the next candidate may
  be handed holds no answer;
* the buffers are inspected (guards, unwritten elements, inputs) before the values,
  because an unwritten element still holds a NaN poison and would otherwise be reported as
  a numerical failure.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any

import torch

from harness.core import flops as flops_mod
from harness.core import iomodel
from harness.core.buffers import InputSnapshot, OutputBuffers
from harness.core.candidate import Candidate
from harness.core.cases import Case, make_inputs
from harness.core.reference import naive_for_case, reference_for_case
from harness.core.results import CaseResult, Status
from harness.core.tolerance import Baseline, check_output


def sync_device(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def integrity_problems(bufs: Any, snapshot: InputSnapshot, inputs: Any) -> str | None:
    """What a run did to the harness's buffers and the inputs: writes outside the outputs,
    outputs left unwritten, inputs modified (one line, or None)."""
    problems = [p for p in (bufs.check_guards(), bufs.unwritten(), snapshot.changed(inputs))
                if p]
    return "; ".join(problems) or None


def describe_exception(exc: BaseException) -> str:
    """`Type: message` plus the innermost frame, so a candidate's error names its line."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" ({tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}{where}"


def _run_once(candidate: Candidate, case: Case, inputs, bufs: OutputBuffers,
              device: str | torch.device) -> str | None:
    """Poison, run, wait. Returns an error description if the candidate raised."""
    bufs.poison()
    try:
        candidate.run(case, inputs, bufs.out, bufs.lse)
        sync_device(device)  # an asynchronous CUDA error surfaces here, inside the try
    except Exception as exc:  # any failure of the candidate becomes a verdict, not a dead run
        return describe_exception(exc)
    return None


# The oracle and the naive baseline of the most recent case, on the CPU, reused while the
# runner takes every candidate through that case. Inputs are drawn afresh for each candidate
# (the draw is deterministic), so a candidate that writes into its inputs cannot taint the
# next one.
_ORACLE_CACHE: dict[tuple, tuple] = {}


def _oracle(case: Case, secret: int, device: str | torch.device,
            oracle_device: str | torch.device | None) -> tuple:
    """(ref, base, baseline) on the CPU. Computed on `oracle_device` (default: the case's
    device) from a fresh draw of the inputs, after the candidate has run."""
    where = torch.device(oracle_device) if oracle_device is not None else torch.device(device)
    key = (case, secret, str(where))
    if key not in _ORACLE_CACHE:
        _ORACLE_CACHE.clear()
        # Drawn where the candidate's were (large cases are drawn on the device, with the
        # device's generator), then moved: the oracle sees exactly the candidate's inputs.
        inputs = make_inputs(case, device, secret=secret).to(where)
        ref = judged_rows(case, reference_for_case(case, inputs))
        base = judged_rows(case, naive_for_case(case, inputs))
        baseline = Baseline.compute(ref, base, case.torch_dtype)
        baseline = dataclasses.replace(baseline, masked_rows=baseline.masked_rows.to("cpu"))
        cpu = tuple(_to_cpu(t) for t in (ref, base))
        if where.type == "cuda":
            _poison_device(ref, base)
            del inputs, ref, base
            torch.cuda.synchronize(where)
            torch.cuda.empty_cache()
        _ORACLE_CACHE[key] = (*cpu, baseline)
    return _ORACLE_CACHE[key]


def judged_rows(case: Case, pair: tuple) -> tuple:
    """(out, lse) restricted to the rows that are outputs: a varlen case's padding rows
    between packed sequences are checked for being untouched (buffers), not for values."""
    from harness.core.serving import row_valid

    valid = row_valid(case) if case.is_serving else None
    if valid is None:
        return pair
    return tuple(None if t is None else t[:, :, valid.to(t.device)] for t in pair)


def _to_cpu(pair: tuple) -> tuple:
    return tuple(None if t is None else t.detach().to("cpu", copy=True) for t in pair)


def _poison_device(*pairs: tuple) -> None:
    for pair in pairs:
        for t in pair:
            if t is not None and t.device.type == "cuda" and t.is_floating_point():
                t.fill_(float("nan"))


def _model_bytes(candidate: Candidate, case: Case) -> int | None:
    # Candidates whose tiles depend on the case (a split count chosen by a heuristic)
    # resolve them per case.
    tiles_for = getattr(candidate, "tiles_for", None)
    tiles = tiles_for(case) if callable(tiles_for) else candidate.tiles
    try:
        return iomodel.hbm_bytes(candidate.algorithm, case, tiles)
    except ValueError:
        return None  # an algorithm the IO model does not know: no model bytes


def check_case(candidate: Candidate, case: Case, *, device: str | torch.device, secret: int = 0,
               repeats: int = 1, oracle_device: str | torch.device | None = None) -> CaseResult:
    """Run `candidate` on `case` and judge it; never raises for a candidate's fault.
    `repeats` > 1 reruns it and requires bitwise-equal outputs (a race check), unless the
    candidate declares itself nondeterministic."""
    reason = candidate.supports(case)
    if reason:
        return CaseResult(candidate.name, case, Status.SKIPPED, reason)
    writes_lse = candidate.support.writes_lse
    inputs = make_inputs(case, device, secret=secret)
    result = CaseResult(candidate.name, case, Status.PASSED,
                        flops=flops_mod.attention_flops(case, inputs),
                        bytes_model=_model_bytes(candidate, case),
                        bytes_ideal=iomodel.ideal_bytes(case))
    bufs = OutputBuffers.allocate(case, device, writes_lse)
    snapshot = InputSnapshot.take(inputs)

    def fail(status: Status, message: str) -> CaseResult:
        result.status, result.message = status, message
        return result

    try:
        # 1. The candidate, with no answer anywhere: buffer integrity after every run.
        err = _run_once(candidate, case, inputs, bufs, device)
        if err:
            return fail(Status.ERROR, f"candidate raised {err}")
        problems = integrity_problems(bufs, snapshot, inputs)
        if problems:
            return fail(Status.FAILED, problems)
        out = bufs.out.detach().to("cpu", copy=True)
        lse = None if bufs.lse is None else bufs.lse.detach().to("cpu", copy=True)
        why = _race_check(candidate, case, inputs, bufs, snapshot, out, lse, repeats, device,
                          result)
        if why:
            return fail(Status.FAILED if not why.startswith("candidate raised") else
                        Status.ERROR, why)
        # 2. Only now the expected output, judged on the CPU copies of the candidate's output.
        ref, base, baseline = _oracle(case, secret, device, oracle_device)
        out, lse = judged_rows(case, (out, lse))
        verdict = check_output(case, out, lse, ref, base, writes_lse=writes_lse,
                               masked_lse=candidate.support.masked_lse, baseline=baseline)
    finally:
        # What the candidate said of its runs (the first and any repeats), whatever the
        # verdict: drained here, so it never lands on the next case.
        notes = candidate.take_notes()
        if notes:
            result.extra["notes"] = notes
        # What the candidate wrote may be a correct answer: poisoned before it is freed.
        bufs.poison()
    result.errors = verdict.errors
    if not verdict.passed:
        return fail(Status.FAILED, verdict.message)
    result.message = verdict.message
    return result


def _race_check(candidate: Candidate, case: Case, inputs, bufs: OutputBuffers,
                snapshot: InputSnapshot, out: torch.Tensor, lse: torch.Tensor | None,
                repeats: int, device: str | torch.device, result: CaseResult) -> str | None:
    if repeats <= 1:
        return None
    if not candidate.support.deterministic:
        result.extra["race_check"] = "skipped: candidate declares nondeterminism"
        return None
    for r in range(1, repeats):
        err = _run_once(candidate, case, inputs, bufs, device)
        if err:
            return f"candidate raised on repeat {r}: {err}"
        problems = integrity_problems(bufs, snapshot, inputs)
        if problems:
            return f"repeat {r}: {problems}"
        # Bitwise equality (bits, not values: NaN != NaN, and -0 == +0 would hide races).
        same = bitwise_equal(out, bufs.out.to("cpu")) and (
            lse is None or bitwise_equal(lse, bufs.lse.to("cpu")))
        if not same:
            return (f"nondeterministic: repeat {r} of {repeats} differs bitwise from the "
                    f"first run (race?)")
    result.extra["race_check"] = f"{repeats} runs bitwise equal"
    return None


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    ints = {2: torch.int16, 4: torch.int32}
    return torch.equal(a.view(ints[a.element_size()]), b.view(ints[b.element_size()]))
