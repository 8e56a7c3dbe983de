"""Input distributions: what q, k and v are drawn from (`Case.dist`).

- normal (the default): every element N(0, 1), as every case before this axis;
- outliers: N(0, 1) + N(0, 100) * Bernoulli(0.001), the distribution of the
  FlashAttention-3 paper's accuracy table: one element in a thousand has a standard
  deviation of 10, as the outlier features of trained models do;
- large: peaky rows near the fp16 range. K is N(0, 1) * K_SCALE, and every PEAKY_EVERY-th
  query row (from row PEAKY_FIRST) is scaled so that its largest |q . k| over all keys
  reaches PEAK_TARGET, twice the fp16 maximum (a sixth of its keys or so lie above it): a kernel that stores S = QK^T in
  fp16 overflows there, and the scaled scores (thousands) overflow exp() in float32 unless
  the row's running max is subtracted. The other rows stay N(0, 1). A kernel keeping S in
  float32 (as FlashAttention does) has no trouble with them, so on these inputs the naive
  yardstick keeps S in float32 too (harness.core.reference.naive_for_case).

Every distribution starts from the same N(0, 1) draw: the extra draws (outliers' positions
and sizes) come from a generator of their own, so a normal case is drawn exactly as before
the axis existed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class Dist(StrEnum):
    NORMAL = "normal"
    OUTLIERS = "outliers"
    LARGE = "large"


OUTLIER_P = 0.001  # Bernoulli(0.001)
OUTLIER_STD = 10.0  # N(0, 100): variance 100
FP16_MAX = 65504.0
PEAK_TARGET = 2 * FP16_MAX
K_SCALE = 8.0
PEAKY_EVERY, PEAKY_FIRST = 4, 1


def peaky_rows(seqlen_q: int) -> slice:
    """The query rows a `large` case makes peaky."""
    return slice(PEAKY_FIRST, seqlen_q, PEAKY_EVERY)


def shape_inputs(dist: Dist, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (float32, drawn N(0, 1)) turned into `dist`'s (module doc), still float32.
    `gen` (on the tensors' device) draws whatever the distribution adds."""
    import torch

    if dist is Dist.NORMAL:
        return q, k, v
    if dist is Dist.OUTLIERS:
        def spike(t: torch.Tensor) -> torch.Tensor:
            hit = torch.rand(t.shape, generator=gen, device=t.device) < OUTLIER_P
            big = torch.randn(t.shape, generator=gen, device=t.device) * OUTLIER_STD
            return t + big * hit

        return spike(q), spike(k), spike(v)
    k = k * K_SCALE
    rows = peaky_rows(q.shape[2])
    group = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(group, dim=1)  # (B, H, Nk, d): each query head's keys
    peak = (q[:, :, rows] @ kk.transpose(-1, -2)).abs().amax(dim=-1, keepdim=True)
    q = q.clone()
    q[:, :, rows] *= PEAK_TARGET / peak.clamp(min=1e-6)
    return q, k, v
