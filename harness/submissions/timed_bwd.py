"""Timed calls of a submission's backward, every one of them checked as the forward's are
(harness.submissions.timed), so that a backward that is right only when checked cannot
score. Every timed call:

- gets FRESH inputs drawn before it (outside the timed region) from the secret seed and a
  new draw index: q, k, v (and the mask), the output gradient dO from its own secret draw,
  and the forward's O (the float64 oracle's, in the case dtype) and LSE (float32, in the
  candidate's masked-row convention), as a FlashAttention backward receives them;
- writes into harness-owned dQ, dK and dV buffers poisoned just before it;
- is timed by the same `CallTimer` as the forward (its own events inside
  `harness.measure.timing`'s sample), with the poison count of the three gradients queued
  on the same stream right after the closing event (the baseline's autograd backward
  alone is timed, its forward prepared before: `_backward_call`);
- is then checked: that count, the guard zones, every input unchanged bitwise (O, LSE and
  dO too), every gradient element finite, and dQ at a secret random subset of query rows
  (plus every fully masked row) and dK, dV at a secret random subset of key rows (plus
  every key no query sees) against the float64 oracle with the backward's tolerance rule
  (harness.submissions.grad_sample).
A failed check raises `CheatDetected` naming the call, the case and the check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from harness.core.buffers import GradBuffers, InputSnapshot
from harness.core.candidate import Candidate
from harness.core.cases import Case, GradInputs, derive_seed, make_grad_output, make_inputs
from harness.submissions.grad_sample import check_sampled, pick_keys
from harness.submissions.timed import (
    ROW_PICK_DRAW,
    TIMED_DRAW_BASE,
    CallTimer,
    CheatDetected,
    ScoringOptions,
    TimedCase,
    check_call,
    count_poison,
    pick_rows,
    sample_checked,
)

# The row and key picks of the backward: a generator of their own, apart from the forward's.
KEY_PICK_DRAW = ROW_PICK_DRAW + 1


def count_poison_grads(grads: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Gradient elements still holding the poison, as a device tensor (not synchronised)."""
    n = count_poison(grads[0], None)
    for g in grads[1:]:
        n = n + count_poison(g, None)
    return n


def _backward_call(candidate: Candidate, case: Case, inputs: GradInputs, bufs: GradBuffers
                   ) -> tuple[Callable[[], None], Callable[[], torch.Tensor]]:
    """(the timed call, the check queued right after it). A submission's backward writes
    into the harness's buffers in the timed region. An autograd-based baseline (an SDPA
    peer) has its forward prepared here, outside it, as harness.measure.perf_bwd times it,
    and its gradients copied into the buffers after the closing event: timing its forward
    or copies would flatter every submission's speed-up."""
    prepare = getattr(candidate, "backward_timed_call", None)
    if prepare is None:
        return (lambda: candidate.run_backward(case, inputs, *bufs.grads),
                lambda: count_poison_grads(bufs.grads))
    call = prepare(case, inputs)
    got: list[Any] = []

    def check() -> torch.Tensor:
        for buf, g in zip(bufs.grads, got[0], strict=True):
            buf.copy_(g)
        return count_poison_grads(bufs.grads)

    return lambda: got.append(call()), check


def backward_inputs(case: Case, candidate: Candidate, device: str, *, secret: int,
                    draw: int) -> tuple[GradInputs, torch.Tensor, torch.Tensor]:
    """(what the backward gets, the oracle's float64 O, its LSE) for one draw."""
    from harness.core.reference import reference_for_case

    inputs = make_inputs(case, device, secret=secret, draw=draw)
    out64, lse64 = reference_for_case(case, inputs)
    lse = lse64.float()
    if candidate.support.masked_lse == "+inf":
        lse = torch.where(torch.isneginf(lse), torch.full_like(lse, torch.inf), lse)
    grad_in = GradInputs(inputs.q, inputs.k, inputs.v, inputs.mask, inputs.key_lengths,
                         inputs.serving, out=out64.to(case.torch_dtype), lse=lse,
                         dout=make_grad_output(case, device, secret=secret, draw=draw))
    return grad_in, out64, lse64


def timed_backward_calls(candidate: Candidate, case: Case, *, secret: int, timer: CallTimer,
                         options: ScoringOptions, device: str,
                         cut_above_ms: float | None = None) -> TimedCase:
    """Time `candidate`'s backward on `case`, every call with fresh inputs and fully
    checked (module doc); the sampling as `harness.submissions.timed.timed_calls`."""
    bufs = GradBuffers.allocate(case, device)
    gen = torch.Generator()
    # Which rows and keys get the oracle is secret too: derived from the secret, never stored.
    gen.manual_seed(derive_seed(case, secret, draw=KEY_PICK_DRAW))
    calls = {"n": 0}

    def one_call(draw: int) -> tuple[float, bool, float | None]:
        inputs, out64, lse64 = backward_inputs(case, candidate, device, secret=secret,
                                               draw=TIMED_DRAW_BASE + draw)
        snapshot = InputSnapshot.take(inputs)
        run, check = _backward_call(candidate, case, inputs, bufs)
        bufs.poison()
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()  # inputs and poison in place before the timed region
        ms, unwritten, valid, clock = timer.sample(run, check)
        calls["n"] += 1
        where = f"timed backward call {calls['n']} on {case.id}"
        check_call(where, unwritten, bufs.grads, bufs, snapshot, inputs, what="gradient",
                   named="dQ, dK, dV")
        rows = pick_rows(case, inputs, gen, options.sampled_rows)
        keys = pick_keys(case, inputs, gen, options.sampled_rows)
        assert inputs.dout is not None and inputs.out is not None and inputs.lse is not None
        msg = check_sampled(case, inputs, inputs.dout, inputs.out, inputs.lse, out64, lse64,
                            bufs.grads, rows, keys)
        if msg:
            raise CheatDetected(f"{where}: gradients wrong on sampled rows and keys: {msg}")
        return ms, valid, clock

    return sample_checked(one_call, timer=timer, options=options, cut_above_ms=cut_above_ms,
                          calls=calls)
