"""The gradient oracle on a sample, for the per-call checks of a timed backward
(harness.submissions.timed_bwd): dQ at a few query rows, dK and dV at a few key rows.

The whole float64 backward of a perf-sized case is far too costly to run after every timed
call, but the chain rule of harness.core.reference_grad needs, per query row i, only its
LSE and D_i = rowsum(dO_i * O_i):

    P_ij = exp(scale q_i . k_j - LSE_i)              (0 where (i, j) is masked)
    dS_ij = P_ij (dO_i . v_j - D_i)
    dQ_i = scale sum_j dS_ij k_j                     (every key of row i)
    dK_j = scale sum_i dS_ij q_i,  dV_j = sum_i P_ij dO_i   (every query row of key j,
                                                     summed over the GQA group's heads)

so a sample of rows and keys costs (rows + keys) x N x d multiply-adds once those two
row statistics are known. The oracle takes them from the float64 forward oracle of the
call's inputs (computed anyway: its O and LSE are the backward's inputs); the yardstick of
the tolerance rule, the same-precision naive backward, from what the backward receives
(O in the case dtype, LSE in float32), with the naive backward's roundings
(harness.core.reference_grad._naive_grad_block). Dense cases without a window only: the
scored grids.
"""

from __future__ import annotations

import math

import torch

from harness.core.cases import Case, Inputs

Grads = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def visibility_keys(case: Case, inputs: Inputs, keys: torch.Tensor) -> torch.Tensor:
    """(B|1, 1, Nq, len(keys)) boolean visibility of the given key rows."""
    device = inputs.q.device
    i = torch.arange(case.seqlen_q, device=device)[:, None]
    j = keys.to(device)[None, :]
    vis = torch.ones((1, 1, case.seqlen_q, len(keys)), dtype=torch.bool, device=device)
    if case.mask.is_causal:
        vis = vis & (j <= i + case.causal_offset)[None, None]
    if inputs.mask is not None:
        m = inputs.mask.to(device).index_select(3, keys.to(device))
        vis = vis & m.expand(-1, -1, case.seqlen_q, -1)
    return vis


def pick_keys(case: Case, inputs: Inputs, gen: torch.Generator, n: int) -> torch.Tensor:
    """`n` random key rows (secret generator) plus every key no query row of some batch
    sees (padding, beyond the causal reach), whose dK and dV must be 0."""
    perm = torch.randperm(case.seqlen_k, generator=gen)[:n]
    unseen = torch.zeros(case.seqlen_k, dtype=torch.bool)
    if case.mask.is_causal:
        reach = case.seqlen_q - 1 + case.causal_offset
        unseen[max(0, reach + 1):] = True
    if inputs.mask is not None:
        unseen |= (~inputs.mask.any(dim=2)).any(dim=0).flatten().cpu()
    return torch.unique(torch.cat([perm, unseen.nonzero().flatten()])).sort().values


def _heads(t: torch.Tensor, group: int) -> torch.Tensor:
    """(B, Hkv, n, d) -> (B, H, n, d): each K/V head repeated for its query heads."""
    return t.repeat_interleave(group, dim=1) if group > 1 else t


def sampled_grads(case: Case, inputs: Inputs, dout: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor, *,
                  exact: bool) -> Grads:
    """(dQ at `rows` (B, H, r, d), dK and dV at `keys` (B, Hkv, k, d)) from the row
    statistics `out` and `lse` (module doc): in float64 (`exact`) or as the naive
    backward in the case dtype rounds them."""
    from harness.submissions.timed import visibility_rows

    if case.has_window:
        raise ValueError("sampled gradients are for windowless dense cases")
    q, k, v = inputs.q, inputs.k, inputs.v
    b, h, nq, d = q.shape
    hkv = k.shape[1]
    group = h // hkv
    dt = case.torch_dtype
    w = torch.float64 if exact else torch.float32
    scale = 1.0 / math.sqrt(d)
    live = torch.isfinite(lse)  # a fully masked row (either convention) has P = 0
    lse_w = torch.where(live, lse.to(w), torch.zeros((), dtype=w, device=lse.device))
    delta = (dout.to(w) * out.to(w)).sum(dim=-1)

    def scores(a: torch.Tensor, bk: torch.Tensor) -> torch.Tensor:
        if exact:
            return (a.double() @ bk.double().transpose(-1, -2)) * scale
        return (a.float() @ bk.float().transpose(-1, -2)).to(dt).float() * scale

    def rnd(t: torch.Tensor) -> torch.Tensor:
        return t if exact else t.to(dt).float()

    def probs(s: torch.Tensor, lse_r: torch.Tensor, live_r: torch.Tensor,
              vis: torch.Tensor) -> torch.Tensor:
        ok = vis & live_r[..., None]
        return torch.where(ok, torch.exp(torch.where(ok, s - lse_r[..., None], 0.0)), 0.0)

    ridx = rows.to(q.device)
    kk, vv = _heads(k, group).to(w), _heads(v, group).to(w)
    q_r, do_r = q.index_select(2, ridx), dout.index_select(2, ridx).to(w)
    p = probs(scores(q_r, kk), lse_w.index_select(2, ridx), live.index_select(2, ridx),
              visibility_rows(case, inputs, rows))
    dp = rnd(do_r @ vv.transpose(-1, -2))
    ds = rnd(p * (dp - delta.index_select(2, ridx)[..., None]))
    dq = (ds @ kk) * scale
    dq = dq if exact else dq.to(dt)

    kidx = keys.to(q.device)
    k_j, v_j = _heads(k.index_select(2, kidx), group), _heads(v.index_select(2, kidx), group)
    p32 = probs(scores(q, k_j), lse_w, live, visibility_keys(case, inputs, keys))
    do_w = dout.to(w)
    dv = rnd(p32).transpose(-1, -2) @ do_w
    dp = rnd(do_w @ v_j.to(w).transpose(-1, -2))
    ds = rnd(p32 * (dp - delta[..., None]))
    dk = (ds.transpose(-1, -2) @ q.to(w)) * scale
    nk = len(keys)
    # GQA: a K/V head's gradient is the sum over its group's query heads.
    dk = dk.reshape(b, hkv, group, nk, d).sum(dim=2)
    dv = dv.reshape(b, hkv, group, nk, d).sum(dim=2)
    if not exact:
        dk, dv = dk.to(dt), dv.to(dt)
    return dq, dk, dv


def check_sampled(case: Case, inputs: Inputs, dout: torch.Tensor, given_out: torch.Tensor,
                  given_lse: torch.Tensor, oracle_out: torch.Tensor,
                  oracle_lse: torch.Tensor, grads: Grads, rows: torch.Tensor,
                  keys: torch.Tensor) -> str | None:
    """The one tolerance rule (harness.core.tolerance.check_grads) on the sample: None
    when dQ at `rows` and dK, dV at `keys` pass, else its message."""
    from harness.core.tolerance import GradBaseline, check_grads

    ref = sampled_grads(case, inputs, dout, oracle_out, oracle_lse, rows, keys, exact=True)
    base = sampled_grads(case, inputs, dout, given_out, given_lse, rows, keys, exact=False)
    dq, dk, dv = grads
    ridx, kidx = rows.to(dq.device), keys.to(dk.device)
    got = (dq.index_select(2, ridx), dk.index_select(2, kidx), dv.index_select(2, kidx))
    masked = ~torch.isfinite(oracle_lse.index_select(2, ridx.to(oracle_lse.device)))
    baseline = GradBaseline.compute(ref, base, case.torch_dtype, masked)
    verdict = check_grads(got, ref, baseline)
    return None if verdict.passed else verdict.message
