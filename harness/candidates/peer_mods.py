"""The score modifiers the SDPA peers (harness.candidates.peers) can and cannot run.

SDPA's one hook into the scores is `attn_mask`: a float mask is added to the scaled
scores before the softmax. So:

- ALiBi runs: its bias -slope_h * |i + o - j| (o = 0 under causal_tl, else Nk - Nq, also
  without a causal mask; harness.core.reference's module doc) is a float mask, with -inf
  where the case's mask or window hides the key. It is materialised (B|1, H, Nq, Nk) in
  float32 (SDPA takes a float32 mask with fp16/bf16 inputs; in fp16 the bias's rounding
  fails the check where every visible key is far away: docs/score-mods.md, "Peers") in
  the preparation (outside the timed call), and it replaces is_causal and the boolean
  masks: a backend that takes no float mask (flash) refuses it and is skipped with
  torch's reason;
- softcap cannot: tanh of the scores is not an addition, and SDPA has no hook after QK^T;
- sinks cannot: a sink is a term of the denominator with no key, and SDPA returns no LSE
  (publicly) to fold it in afterwards (flex_attention does: harness.candidates.flex_mods).

Written from the rule, not from the oracle's code, so that the check means something.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from harness.core.cases import Case, Inputs

# Why a peer skips a modifier it cannot apply: more than the declaration's "not supported".
MOD_REASONS = {
    "softcap": "SDPA cannot softcap: its only hook into the scores is an additive attn_mask, "
               "and c * tanh(s / c) is not an addition",
    "sinks": "SDPA cannot add a sink: a sink is a term of the softmax's denominator with "
             "no key, and SDPA has neither a sink argument nor a public LSE to fold one in",
}


def mod_reason(case: Case) -> str | None:
    """Why an SDPA peer skips this case's modifiers, or None when it can run them."""
    if case.softcap:
        return MOD_REASONS["softcap"]
    if case.sinks:
        return MOD_REASONS["sinks"]
    return None


def alibi_mask(case: Case, inputs: Inputs) -> torch.Tensor:
    """The float attn_mask of an ALiBi case, its mask and window folded in as -inf."""
    device = inputs.q.device
    if case.has_window:  # the band of harness.core.serving, the causal limit in it
        from harness.core.serving import seq_visibility

        vis = seq_visibility(case, case.seqlen_q, case.seqlen_k)[None, None].to(device)
    else:
        vis = causal_visible(case)
        vis = None if vis is None else vis.to(device)
    if inputs.mask is not None:
        m = inputs.mask.to(device=device, dtype=torch.bool)
        vis = m if vis is None else vis & m
    return alibi_bias(case, inputs, vis)


def alibi_bias(case: Case, inputs: Inputs, visible: torch.Tensor | None) -> torch.Tensor:
    """The float attn_mask of an ALiBi case: (B|1, H, Nq, Nk) in float32, the bias
    -slope_h * |i + o - j| where `visible` (boolean, broadcastable to (B, 1, Nq, Nk);
    None: every key) holds, -inf elsewhere."""
    assert inputs.alibi_slopes is not None, "an ALiBi case draws its slopes"
    device = inputs.q.device
    nq, nk = case.seqlen_q, case.seqlen_k
    o = 0 if case.mask.value == "causal_tl" else nk - nq
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    dist = (i + o - j).abs().float()
    slopes = inputs.alibi_slopes.to(device=device, dtype=torch.float32)
    bias = -slopes[None, :, None, None] * dist[None, None]  # (1, H, Nq, Nk), float32
    if visible is not None:
        bias = bias.masked_fill(~visible.to(device=device, dtype=torch.bool), -torch.inf)
    return bias


def causal_visible(case: Case) -> torch.Tensor | None:
    """(1, 1, Nq, Nk) boolean causal visibility (key j seen by query i iff
    j <= i + offset: 0 top-left, Nk - Nq bottom-right), None without a causal mask."""
    if case.mask.value not in ("causal_tl", "causal_br"):
        return None
    o = 0 if case.mask.value == "causal_tl" else case.seqlen_k - case.seqlen_q
    i = torch.arange(case.seqlen_q)[:, None]
    j = torch.arange(case.seqlen_k)[None, :]
    return (j <= i + o)[None, None]
