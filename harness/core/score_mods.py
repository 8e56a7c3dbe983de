"""The score modifiers' inputs: ALiBi slopes and sink logits, drawn from a case's seed.

The semantics of the modifiers (softcap, ALiBi, sinks) are the oracle's:
harness.core.reference's module doc. What lives here is the harness's side of them: the
per-head values it owns and hands every candidate, drawn like q, k and v from the case's
seed (mixed with the secret of a scored submission), so that no kernel can hard-code
them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from harness.core.cases import Case

# ALiBi slopes: the geometric sequence of the ALiBi paper, 2^(-8 (h + 1) / H), each
# scaled by a factor drawn from [0.5, 1.5) so that no kernel can hard-code them. Sink
# logits are drawn from [SINK_LOW, SINK_HIGH): from a sink that barely matters to one that
# takes most of the mass of a short row.
SLOPE_SCALE = (0.5, 1.5)
SINK_LOW, SINK_HIGH = -2.0, 4.0


def score_mod_inputs(case: Case, seed: int) -> tuple[torch.Tensor | None,
                                                     torch.Tensor | None]:
    """(alibi_slopes, sinks) of `case`: float32 (H,) each, or None where the case has no
    such modifier. Drawn on the CPU from `seed` (the case's, mixed with the secret)."""
    import torch

    if not (case.alibi or case.sinks):
        return None, None
    gen = torch.Generator()
    gen.manual_seed(seed)
    h = torch.arange(1, case.heads + 1, dtype=torch.float64)
    lo, hi = SLOPE_SCALE
    factor = lo + (hi - lo) * torch.rand(case.heads, generator=gen, dtype=torch.float64)
    slopes = (torch.exp2(-8.0 * h / case.heads) * factor).float()
    sinks = SINK_LOW + (SINK_HIGH - SINK_LOW) * torch.rand(case.heads, generator=gen,
                                                           dtype=torch.float64)
    return (slopes if case.alibi else None), (sinks.float() if case.sinks else None)
