"""The perf run's backward pass: a candidate's backward timed on the same footing as its
forward (harness.measure.perf), one entry per (candidate, case) with `extra["pass"] =
"bwd"`, never folded into the forward's.

Per case the isolated child first judges the backward (harness.core.check_grad: the
gradient oracle, harness-owned dQ/dK/dV buffers, inputs unmodified), and only when it
passed times it with the timing method (`time_backward_case`): the forward's
`harness.measure.perf.check_then_time` with its `pass` option "bwd". The timed call is the backward alone:
- a CUDA variant's `[backward]` launches, into plain dQ/dK/dV tensors;
- a Python candidate's or peer's `backward_timed_call` (for the autograd-based ones the
  forward runs in its preparation, outside the timed region).
Its inputs are fresh draws per timing set (q, k, v, dO), with O and LSE from the
same-precision naive forward (harness.core.reference.naive_for_case): the backward's
work does not depend on how exact its O is, and the float64 oracle for every timing set
would cost more than the timing. FLOPs are `flops.attention_bwd_flops` (2.5x the
forward's for a dense case), bytes the backward's IO model (harness.core.iomodel_bwd).
"""

from __future__ import annotations

from harness.core.candidate import Candidate
from harness.core.cases import Case, GradInputs
from harness.core.results import Timing


def timing_grad_inputs(case: Case, candidate: Candidate, *, secret: int = 0,
                       draw: int = 0) -> GradInputs:
    """One timing set of the backward's inputs on the GPU (the module doc)."""
    import torch

    from harness.core.cases import make_grad_output, make_inputs
    from harness.core.reference import naive_for_case

    inputs = make_inputs(case, "cuda", secret=secret, draw=draw)
    out, lse = naive_for_case(case, inputs)
    lse = lse.float()
    if candidate.support.masked_lse == "+inf":
        lse = torch.where(torch.isneginf(lse), torch.full_like(lse, torch.inf), lse)
    return GradInputs(inputs.q, inputs.k, inputs.v, inputs.mask, inputs.key_lengths, inputs.serving,
                      out=out.to(case.torch_dtype).contiguous(), lse=lse.contiguous(),
                      dout=make_grad_output(case, "cuda", secret=secret, draw=draw))


def grad_buffers(case: Case):
    """Plain dQ, dK, dV tensors for timing (the guarded ones are for the check)."""
    import torch

    q_shape = (case.batch, case.heads, case.seqlen_q, case.head_dim)
    kv_shape = (case.batch, case.kv_heads, case.seqlen_k, case.head_dim)
    return (torch.empty(q_shape, dtype=case.torch_dtype, device="cuda"),
            torch.empty(kv_shape, dtype=case.torch_dtype, device="cuda"),
            torch.empty(kv_shape, dtype=case.torch_dtype, device="cuda"))


def make_backward_launch(candidate: Candidate, case: Case, sets: list[GradInputs]):
    """launch(i) runs the candidate's backward on set i."""
    timed = getattr(candidate, "backward_timed_call", None)
    if timed is not None:
        calls = [timed(case, s) for s in sets]
        return lambda i: calls[i]()
    dq, dk, dv = grad_buffers(case)
    return lambda i: candidate.run_backward(case, sets[i], dq, dk, dv)


def time_backward_case(candidate: Candidate, case: Case, *, mode: str = "cold",
                       n_sets: int | None = None, rule: dict | None = None, secret: int = 0,
                       hold: bool = True) -> Timing:
    """Time `candidate`'s backward on `case` with the timing method."""
    from harness.core.iomodel_bwd import ideal_bytes_bwd
    from harness.measure.timing import StopRule, measure, timing_sets

    n = n_sets or timing_sets(ideal_bytes_bwd(case), mode)
    sets = [timing_grad_inputs(case, candidate, secret=secret, draw=i) for i in range(n)]
    launch = make_backward_launch(candidate, case, sets)
    stop = StopRule(**rule) if rule else None
    return measure(launch, n_sets=n, mode=mode, rule=stop, hold=hold)
