"""The score modifiers flex_attention is given (harness.candidates.flex): softcap and
ALiBi as a `score_mod`, sinks as a renormalisation by the LSE flex returns.

Written from the rule in harness.core.reference's module doc (docs/score-mods.md), not
from its code, so that the check of the peer against the oracle means something. flex
calls `score_mod(score, b, h, q_idx, kv_idx)` on the scaled score of every pair before
the mask, which is the rule's order: s = c * tanh(s / c), then s -= slope_h * |i + o - j|
with o = 0 under causal_tl, else Nk - Nq (also without a causal mask); the mask_mod's
-inf comes after.

A sink cannot be a score_mod: it is a logit in the denominator with no key of its own,
and a score_mod only changes the scores of existing keys. flex returns the LSE of the
row, l = log(sum_j e^(s_j)), so the sink z_h is folded in afterwards, exactly:

    out' = out * e^l / (e^l + e^z) = out * sigmoid(l - z),    l' = logaddexp(l, z)

(a row that sees no key: l = -inf, so out' = 0 and l' = z, the rule's). This LSE
renormalisation is how sinks are run on flex_attention (torch has no sink argument); it
costs an elementwise pass over O after the kernel, timed with it (docs/score-mods.md,
"Peers").

As in harness.candidates.flex_masks, every number a score_mod reads is a captured
tensor, never a Python number: dynamo guards on a closure's constants, so each new cap or
offset of a grid would compile the kernel again.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ScoreMod = Callable[..., torch.Tensor]


def score_mod_for(softcap: float, alibi_slopes: torch.Tensor | None, mask_kind: str,
                  nq: int, nk: int, device: torch.device | str) -> ScoreMod | None:
    """The score_mod of a case's softcap (0.0: none) and ALiBi slopes (float32 (H,) per
    query head, or None), or None when the case has neither."""
    mods: list[ScoreMod] = []
    if softcap:
        cap = torch.tensor(float(softcap), dtype=torch.float32, device=device)

        def capped(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor,
                   q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            return cap * torch.tanh(score / cap)

        mods.append(capped)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(device=device, dtype=torch.float32)
        offset = torch.tensor(0 if mask_kind == "causal_tl" else nk - nq, dtype=torch.int64,
                              device=device)

        def alibi(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor,
                  q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            return score - slopes[h] * (q_idx + offset - kv_idx).abs()

        mods.append(alibi)
    if not mods:
        return None
    if len(mods) == 1:
        return mods[0]
    first, second = mods

    def both(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor,
             q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return second(first(score, b, h, q_idx, kv_idx), b, h, q_idx, kv_idx)

    return both


def with_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of flex with the per-head sink logits (float32 (H,)) folded into the
    denominator (module doc); unchanged without sinks. out (B, H, Nq, d_v), lse (B, H, Nq)."""
    if sinks is None:
        return out, lse
    z = sinks.to(device=lse.device, dtype=torch.float32)[None, :, None]
    lse32 = lse.float()
    keep = torch.sigmoid(lse32 - z)  # e^l / (e^l + e^z); 0 for a row with no key
    return (out.float() * keep[..., None]).to(out.dtype), torch.logaddexp(lse32, z)
