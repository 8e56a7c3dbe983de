"""Check one candidate on one case: the whole correctness protocol in one function.

Order matters: the buffers are inspected (guards, unwritten elements, inputs) before the
values, because an unwritten element still holds a NaN poison and would otherwise be
reported as a numerical failure.
"""

from __future__ import annotations

import traceback

import torch

from harness.core import flops as flops_mod
from harness.core import iomodel
from harness.core.buffers import InputSnapshot, OutputBuffers
from harness.core.candidate import Candidate
from harness.core.cases import Case, make_inputs
from harness.core.reference import naive_for_case, reference_for_case
from harness.core.results import CaseResult, Status
from harness.core.tolerance import Baseline, check_output


def _sync(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _describe(exc: BaseException) -> str:
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
        _sync(device)  # an asynchronous CUDA error surfaces here, inside the try
    except Exception as exc:  # any failure of the candidate becomes a verdict, not a dead run
        return _describe(exc)
    return None


# The oracle and the naive baseline of the most recent case, reused while the runner takes
# every candidate through that case. Inputs are drawn afresh for each candidate (the draw is
# deterministic), so a candidate that writes into its inputs cannot taint the next one.
_ORACLE_CACHE: dict[tuple, tuple] = {}


def _oracle(case: Case, inputs, secret: int, device: str | torch.device) -> tuple:
    key = (case, secret, str(torch.device(device)))
    if key not in _ORACLE_CACHE:
        _ORACLE_CACHE.clear()
        ref, base = reference_for_case(case, inputs), naive_for_case(case, inputs)
        _ORACLE_CACHE[key] = (ref, base, Baseline.compute(ref, base, case.torch_dtype))
    return _ORACLE_CACHE[key]


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
               repeats: int = 1) -> CaseResult:
    """Run `candidate` on `case` and judge it; never raises for a candidate's fault."""
    reason = candidate.supports(case)
    if reason:
        return CaseResult(candidate.name, case, Status.SKIPPED, reason)
    writes_lse = candidate.support.writes_lse
    inputs = make_inputs(case, device, secret=secret)
    result = CaseResult(candidate.name, case, Status.PASSED,
                        flops=flops_mod.attention_flops(case, inputs),
                        bytes_model=_model_bytes(candidate, case),
                        bytes_ideal=iomodel.ideal_bytes(case))
    ref, base, baseline = _oracle(case, inputs, secret, device)
    bufs = OutputBuffers.allocate(case, device, writes_lse)
    snapshot = InputSnapshot.take(inputs)

    def fail(status: Status, message: str) -> CaseResult:
        result.status, result.message = status, message
        return result

    err = _run_once(candidate, case, inputs, bufs, device)
    if err:
        return fail(Status.ERROR, f"candidate raised {err}")
    # Buffer integrity first: stray writes, holes, modified inputs.
    problems = [p for p in (bufs.check_guards(), bufs.unwritten(), snapshot.changed(inputs)) if p]
    if problems:
        return fail(Status.FAILED, "; ".join(problems))
    verdict = check_output(case, bufs.out, bufs.lse, ref, base, writes_lse=writes_lse,
                           masked_lse=candidate.support.masked_lse, baseline=baseline)
    result.errors = verdict.errors
    if not verdict.passed:
        return fail(Status.FAILED, verdict.message)
    result.message = verdict.message

    if repeats > 1:
        if not candidate.support.deterministic:
            result.extra["race_check"] = "skipped: candidate declares nondeterminism"
            return result
        first_out = bufs.out.clone()
        first_lse = None if bufs.lse is None else bufs.lse.clone()
        for r in range(1, repeats):
            err = _run_once(candidate, case, inputs, bufs, device)
            if err:
                return fail(Status.ERROR, f"candidate raised on repeat {r}: {err}")
            problems = [p for p in (bufs.check_guards(), bufs.unwritten(),
                                    snapshot.changed(inputs)) if p]
            if problems:
                return fail(Status.FAILED, f"repeat {r}: " + "; ".join(problems))
            # Bitwise equality (bits, not values: NaN != NaN, and -0 == +0 would hide races).
            same = _bitwise_equal(first_out, bufs.out) and (
                first_lse is None or _bitwise_equal(first_lse, bufs.lse))
            if not same:
                return fail(Status.FAILED, f"nondeterministic: repeat {r} of {repeats} differs "
                                           f"bitwise from the first run (race?)")
        result.extra["race_check"] = f"{repeats} runs bitwise equal"
    return result


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    ints = {2: torch.int16, 4: torch.int32}
    return torch.equal(a.view(ints[a.element_size()]), b.view(ints[b.element_size()]))
