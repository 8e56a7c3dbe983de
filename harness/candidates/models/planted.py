"""Planted-bug models: each is a correct model with one mistake kernel engineers make.

They exist to prove the harness catches what it claims to catch: every one of them must
come out `failed` on the cases that expose its mistake (tests/test_planted_bugs.py holds
each bug to the case that exposes it). Each overrides exactly one step of its correct
parent, so the mistake is the whole difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.candidates.models import tiles as T
from harness.candidates.models.fa1 import FA1Model
from harness.candidates.models.fa2 import FA2Model, State
from harness.candidates.models.splitkv import SplitKVModel
from harness.core.cases import Case, MaskKind


@dataclass
class NoInfGuard(FA2Model):
    """Online softmax without the -inf guard: a row whose running max is still -inf computes
    exp(-inf - (-inf)) = NaN, and the final O / l divides 0 by 0 on fully masked rows."""

    name: str = "bug_no_inf_guard"

    def online_step(self, state: State, s: torch.Tensor, v: torch.Tensor) -> State:
        o, m, lsum = state
        m_new = torch.maximum(m, s.amax(dim=-1))
        p = torch.exp(s - m_new[..., None])
        alpha = torch.exp(m - m_new)
        return alpha[..., None] * o + torch.matmul(p, v), m_new, alpha * lsum + p.sum(dim=-1)

    def finish(self, o: torch.Tensor, m: torch.Tensor, lsum: torch.Tensor,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        return o / lsum[..., None], m + torch.log(lsum)


@dataclass
class CausalOffByOne(FA2Model):
    """Causal test written j < i + offset: every row loses its diagonal key (row 0 of a
    square causal case sees nothing at all)."""

    name: str = "bug_causal_off_by_one"

    def causal_offset(self, case: Case) -> int:
        return case.causal_offset - 1


@dataclass
class CausalAlignSwapped(FA2Model):
    """Top-left / bottom-right confusion: bottom-right cases get the top-left mask and the
    other way round (identical when Nq == Nk, wrong whenever they differ)."""

    name: str = "bug_causal_align_swapped"

    def causal_offset(self, case: Case) -> int:
        if case.mask is MaskKind.CAUSAL_BR:
            return 0
        return case.seqlen_k - case.seqlen_q


@dataclass
class NoRescale(FA2Model):
    """O accumulator not rescaled by alpha = exp(m_old - m_new) when the running max grows
    (l is): earlier K/V blocks keep weights relative to a stale max."""

    name: str = "bug_no_rescale"

    def online_step(self, state: State, s: torch.Tensor, v: torch.Tensor) -> State:
        o, m, lsum = state
        m_new = torch.maximum(m, s.amax(dim=-1))
        m_use = torch.where(m_new == T.NEG_INF, 0.0, m_new)
        p = torch.exp(s - m_use[..., None])
        alpha = torch.exp(m - m_use)
        return o + torch.matmul(p, v), m_new, alpha * lsum + p.sum(dim=-1)


@dataclass
class NoFinalDivision(FA2Model):
    """Final normalisation O / l forgotten: O is the unnormalised sum of exp-weighted V."""

    name: str = "bug_no_final_division"

    def finish(self, o: torch.Tensor, m: torch.Tensor, lsum: torch.Tensor,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        _, lse = super().finish(o, m, lsum)
        return o, lse


@dataclass
class ScaleOverD(FA2Model):
    """Softmax scale 1/d instead of 1/sqrt(d): a flatter softmax."""

    name: str = "bug_scale_over_d"

    def softmax_scale(self, case: Case) -> float:
        return 1.0 / case.head_dim


@dataclass
class NoScale(FA2Model):
    """Softmax scale forgotten (1 instead of 1/sqrt(d)): a much sharper softmax."""

    name: str = "bug_no_scale"

    def softmax_scale(self, case: Case) -> float:
        return 1.0


@dataclass
class PartialKeyTileDropped(FA2Model):
    """The K/V loop runs over whole blocks only (Nk // B_k): the keys of a last partial
    block never contribute."""

    name: str = "bug_partial_key_tile_dropped"

    def key_tiles(self, case: Case) -> list[tuple[int, int]]:
        return [(c0, c1) for c0, c1 in super().key_tiles(case) if c1 - c0 == self.block_k]


@dataclass
class PartialQueryTileDropped(FA2Model):
    """The grid covers whole Q blocks only (Nq // B_q): the rows of a last partial block
    are never computed nor written."""

    name: str = "bug_partial_query_tile_dropped"

    def query_tiles(self, case: Case) -> list[tuple[int, int]]:
        return [(r0, r1) for r0, r1 in super().query_tiles(case) if r1 - r0 == self.block_q]


@dataclass
class LseWithoutMax(FA2Model):
    """LSE written as log(l), forgetting that l was summed relative to the running max m."""

    name: str = "bug_lse_without_max"

    def finish(self, o: torch.Tensor, m: torch.Tensor, lsum: torch.Tensor,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        out, _ = super().finish(o, m, lsum)
        return out, torch.log(lsum)


@dataclass
class GqaHeadModulo(FA2Model):
    """GQA head mapping h % kv_heads instead of h // group: query heads read the wrong
    K/V head whenever 1 < kv_heads < heads."""

    name: str = "bug_gqa_head_modulo"

    def kv_heads(self, case: Case) -> torch.Tensor:
        return torch.arange(case.heads) % case.kv_heads


@dataclass
class KeyPaddingIgnored(FA2Model):
    """Per-batch key lengths ignored: padded keys take part in the softmax."""

    name: str = "bug_key_padding_ignored"

    def uses_mask_tensor(self, case: Case) -> bool:
        return case.mask is not MaskKind.KEY_PADDING


@dataclass
class FiniteMaskFill(FA2Model):
    """Masked scores filled with the lowest fp16 value (-65504) instead of -inf, as some
    fused kernels do: a fully masked row then averages V (and has a finite LSE)."""

    name: str = "bug_finite_mask_fill"
    mask_fill: float = -65504.0


@dataclass
class SplitKVEmptySplit(SplitKVModel):
    """Split-KV that trusts every split: a split with no visible key for a row divides
    0 by 0 into its partial O, and the combine multiplies that NaN by its zero weight."""

    name: str = "bug_splitkv_empty_split"
    num_splits: int = 4

    def finish(self, o: torch.Tensor, m: torch.Tensor, lsum: torch.Tensor,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        _, lse = super().finish(o, m, lsum)
        return o / lsum[..., None], lse

    @staticmethod
    def combine(o_part: torch.Tensor, lse_part: torch.Tensor,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        top = lse_part.amax(dim=2, keepdim=True)
        top = torch.where(torch.isneginf(top), 0.0, top)
        lse = torch.log(torch.exp(lse_part - top).sum(dim=2, keepdim=True)) + top
        scale = torch.exp(lse_part - lse)
        return (scale.unsqueeze(-1) * o_part).sum(dim=2), lse.squeeze(2)


@dataclass
class SplitKVUnweightedCombine(SplitKVModel):
    """Split-KV combine that averages the partial outputs instead of weighting each by
    exp(lse_s - lse): right only when every split holds the same softmax mass."""

    name: str = "bug_splitkv_unweighted_combine"
    num_splits: int = 4

    @staticmethod
    def combine(o_part: torch.Tensor, lse_part: torch.Tensor,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        _, lse = SplitKVModel.combine(o_part, lse_part)
        live = torch.isfinite(lse_part).to(o_part.dtype)
        n = live.sum(dim=2).clamp(min=1)
        return (live.unsqueeze(-1) * o_part).sum(dim=2) / n.unsqueeze(-1), lse


@dataclass
class FA1MaxNotStored(FA1Model):
    """FA1 that writes O and l back after each K/V block but not the running max m: the
    next block rescales against a stale max (-inf), dropping what came before."""

    name: str = "bug_fa1_max_not_stored"

    def block_update(self, o: torch.Tensor, m: torch.Tensor, lsum: torch.Tensor, s: torch.Tensor,
                     v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        o_new, _, l_new = super().block_update(o, m, lsum, s, v)
        return o_new, m, l_new


PLANTED = (NoInfGuard, CausalOffByOne, CausalAlignSwapped, NoRescale, NoFinalDivision,
           ScaleOverD, NoScale, PartialKeyTileDropped, PartialQueryTileDropped, LseWithoutMax,
           GqaHeadModulo, KeyPaddingIgnored, FiniteMaskFill, SplitKVEmptySplit,
           SplitKVUnweightedCombine, FA1MaxNotStored)


def planted_bugs() -> list[FA2Model | FA1Model]:
    """One fresh instance of every planted-bug model."""
    return [cls(description=" ".join((cls.__doc__ or "").split())) for cls in PLANTED]
