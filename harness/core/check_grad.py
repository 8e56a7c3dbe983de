"""Check one candidate's backward on one case: the forward's protocol (harness.core.check)
for dQ, dK and dV.

- The inputs: q, k, v and the mask of the case's seeded draw, the output gradient dO of
  its own seeded draw (harness.core.cases.make_grad_output; the secret mixed into both),
  and the forward's output O (the float64 oracle's, rounded to the case dtype) and LSE
  (float32, in the candidate's masked-row convention), as a FlashAttention backward
  receives them from its forward. All of them are inputs: a backward that modifies any
  of them fails.
- The candidate runs first, its repeats too, into harness-owned, guarded, poisoned dQ,
  dK and dV buffers; the gradient oracle and the naive backward are computed afterwards
  (harness.core.reference_grad) and judged with the one tolerance rule at the backward's
  factor (harness.core.tolerance.check_grads): every gradient finite, a fully masked
  row's dQ exactly 0, each within 3x the naive backward's error plus the data floor.
- Repeats: the backward runs `repeats` times, and at least `MIN_CALLS` (2): a backward
  is called on the same shapes every training step, and the harness zeroes a variant's
  workspaces only once per case (harness.candidates.cuda_candidate), so one call per
  case cannot tell a backward that resets its dQ accumulator from one that relies on
  the harness having zeroed it. Every call is judged against the oracle, whatever the
  declared determinism (a repeat that differs from the first is judged on its own
  values). Differences between calls: a candidate that declares
  `backward_deterministic` fails on one, the others get it noted
  (`extra["determinism"]`).

The result is the candidate's backward entry (`extra["pass"] = "bwd"`, the backward's
FLOPs and IO-model bytes), never folded into its forward's.
"""

from __future__ import annotations

import torch

from harness.core import flops as flops_mod
from harness.core import iomodel_bwd
from harness.core.buffers import GradBuffers, InputSnapshot
from harness.core.candidate import Candidate
from harness.core.cases import Case, GradInputs, make_grad_output, make_inputs
from harness.core.check import (
    bitwise_equal,
    describe_exception,
    integrity_problems,
    sync_device,
)
from harness.core.reference import reference_for_case
from harness.core.reference_grad import grad_naive_for_case, grad_reference_for_case
from harness.core.results import CaseResult, Status
from harness.core.tolerance import GradBaseline, check_grads

# The isolated child's case function for a backward correctness run
# (harness.execution.isolate's `case_fn` option).
BWD_CASE_FN = "harness.core.check_grad:check_backward_fn"

# The fewest backward calls per case (the module doc: a backward right only on its first
# call per case must fail).
MIN_CALLS = 2

BWD_ALGORITHM = {"fa2": "fa2_bwd", "splitkv": "fa2_bwd", "naive_3pass": "naive_bwd",
                 "naive_fused": "naive_bwd"}


def grad_inputs(case: Case, candidate: Candidate, device: str | torch.device,
                secret: int = 0) -> GradInputs:
    """The backward's inputs of the module doc, on `device`."""
    inputs = make_inputs(case, device, secret=secret)
    out, lse = reference_for_case(case, inputs)
    if candidate.support.masked_lse == "+inf":
        lse = torch.where(torch.isneginf(lse), torch.full_like(lse, torch.inf), lse)
    return GradInputs(inputs.q, inputs.k, inputs.v, inputs.mask, inputs.key_lengths, inputs.serving,
                      out=out.to(case.torch_dtype), lse=lse.float(),
                      dout=make_grad_output(case, device, secret=secret))


def _cpu(grads: tuple) -> tuple:
    """CPU copies; the device copies are overwritten before their memory is freed, so that
    no later call of a candidate in this process can find the expected answer there."""
    out = tuple(g.detach().to("cpu", copy=True) for g in grads)
    for g in grads:
        if g.device.type != "cpu":
            g.detach().fill_(float("nan"))
    return out


def _run(candidate: Candidate, case: Case, inputs: GradInputs, bufs: GradBuffers,
         device: str | torch.device) -> str | None:
    bufs.poison()
    try:
        candidate.run_backward(case, inputs, *bufs.grads)
        sync_device(device)
    except Exception as exc:  # any failure of the candidate is a verdict
        return describe_exception(exc)
    return None


def _bwd_bytes(candidate: Candidate, case: Case) -> int | None:
    alg = BWD_ALGORITHM.get(candidate.algorithm)
    if alg is None:
        return None
    return iomodel_bwd.hbm_bytes_bwd(alg, case, candidate.tiles)


def check_backward_case(candidate: Candidate, case: Case, *, device: str | torch.device,
                        secret: int = 0, repeats: int = 1) -> CaseResult:
    """Run `candidate`'s backward on `case` and judge it; never raises for a candidate's
    fault."""
    reason = candidate.supports(case)
    if reason is None and not candidate.support.backward:
        reason = "declares no backward"
    if reason is None and case.has_score_mods:
        # The gradient oracle (harness.core.reference_grad) is plain softmax attention's.
        reason = "the backward of score modifiers (softcap, alibi, sinks) is not checked yet"
    if reason is None and case.head_dim_v:
        reason = "the backward of d_v != d_qk is not checked yet"
    if reason is None and case.fp8.value != "none":
        reason = "the backward of fp8 inputs is not checked (an fp8 case is a forward's)"
    if reason is None and case.dist == "large":
        reason = "the backward on large-magnitude inputs is not checked yet"
    if reason is None:
        reason = candidate.backward_unsupported(case)
    if reason:
        return CaseResult(candidate.name, case, Status.SKIPPED, reason,
                          extra={"pass": "bwd"})
    inputs = grad_inputs(case, candidate, device, secret)
    result = CaseResult(candidate.name, case, Status.PASSED,
                        flops=flops_mod.attention_bwd_flops(case, inputs),
                        bytes_model=_bwd_bytes(candidate, case),
                        bytes_ideal=iomodel_bwd.ideal_bytes_bwd(case), extra={"pass": "bwd"})
    bufs = GradBuffers.allocate(case, device)
    snapshot = InputSnapshot.take(inputs)

    def fail(status: Status, message: str) -> CaseResult:
        result.status, result.message = status, message
        return result

    try:
        err = _run(candidate, case, inputs, bufs, device)
        if err:
            return fail(Status.ERROR, f"candidate raised {err}")
        problems = integrity_problems(bufs, snapshot, inputs)
        if problems:
            return fail(Status.FAILED, problems)
        grads = tuple(g.detach().to("cpu", copy=True) for g in bufs.grads)
        calls = max(repeats, MIN_CALLS)
        others, why = _repeat(candidate, case, inputs, bufs, snapshot, grads, calls, device)
        if why:
            return fail(Status.ERROR if why.startswith("candidate raised") else
                        Status.FAILED, why)
        # Only now the expected gradients, where the inputs are (a GPU computes the float64
        # oracle of a perf-sized case in milliseconds, a CPU in minutes), then on the CPU.
        ref = _cpu(grad_reference_for_case(case, inputs, inputs.dout))
        base = _cpu(grad_naive_for_case(case, inputs, inputs.dout))
        masked = torch.isinf(inputs.lse).to("cpu")  # the LSE given: the oracle's
        baseline = GradBaseline.compute(ref, base, case.torch_dtype, masked)
        verdict = check_grads(grads, ref, baseline)  # type: ignore[arg-type]
        # The first call is the case's result; a later call that differs from it is judged
        # on its own values (one equal to it has its verdict).
        for r, got in others if verdict.passed else []:
            later = check_grads(got, ref, baseline)  # type: ignore[arg-type]
            if not later.passed:
                later.message = (f"repeat {r} (call {r + 1} of {calls}; the first passed): "
                                 f"{later.message}")
                verdict = later
                break
    finally:
        notes = candidate.take_notes()
        if notes:
            result.extra["notes"] = notes
        bufs.poison()  # what the candidate wrote may be a right answer
    result.errors = verdict.errors
    result.extra["grad_errors"] = verdict.detail
    if not verdict.passed:
        return fail(Status.FAILED, verdict.message)
    if others:
        what = (f"{len(others)} of {calls - 1} repeat(s) differ bitwise from the first call "
                f"(repeat {others[0][0]} first)")
        if candidate.support.backward_deterministic:
            return fail(Status.FAILED, f"nondeterministic backward (declared deterministic): "
                                       f"{what}")
        result.extra["determinism"] = f"not bitwise deterministic: {what}"
    else:
        result.extra["determinism"] = f"{calls} runs bitwise equal"
    result.message = verdict.message
    return result


def _repeat(candidate: Candidate, case: Case, inputs: GradInputs, bufs: GradBuffers,
            snapshot: InputSnapshot, grads: tuple, calls: int, device: str | torch.device
            ) -> tuple[list[tuple[int, tuple]], str | None]:
    """Calls 2..`calls`, each compared bitwise with the first: (repeat number and CPU
    copies of each call that differs, for the oracle to judge; why the case fails before
    any value is judged, or None)."""
    differing: list[tuple[int, tuple]] = []
    for r in range(1, calls):
        err = _run(candidate, case, inputs, bufs, device)
        if err:
            return differing, f"candidate raised on repeat {r}: {err}"
        problems = integrity_problems(bufs, snapshot, inputs)
        if problems:
            return differing, f"repeat {r}: {problems}"
        if not all(bitwise_equal(a, b.to("cpu"))
                   for a, b in zip(grads, bufs.grads, strict=True)):
            differing.append((r, tuple(g.detach().to("cpu", copy=True) for g in bufs.grads)))
    return differing, None


def check_backward_fn(candidate: Candidate, case: Case, options: dict) -> CaseResult:
    """`check_backward_case` as an isolated child's case function."""
    return check_backward_case(candidate, case, device=options.get("device") or candidate.device,
                               secret=int(options.get("secret", 0)),
                               repeats=int(options.get("repeats", 1)))
