"""Planted backward bugs: the FA2 model with one mistake in its backward each, the
mistakes the backward invites (the forward stays right, so only a gradient check can
catch them). tests/test_planted_bwd.py holds each to the cases that expose it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.candidates.models import tiles as T
from harness.candidates.models.fa2 import FA2Model
from harness.core.candidate import Support
from harness.core.cases import Case, GradInputs


@dataclass
class DroppedDelta(FA2Model):
    """dS = P * dP: the D = rowsum(dO * O) term of the softmax's chain rule forgotten."""

    name: str = "bug_bwd_dropped_delta"

    def delta(self, dout: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return torch.zeros(dout.shape[:-1])


@dataclass
class MissingScaleInDS(FA2Model):
    """dQ = dS K and dK = dS^T Q without the softmax scale (the forward applies it to S,
    and the chain rule must apply it again)."""

    name: str = "bug_bwd_missing_scale"

    def ds_scale(self, case: Case) -> float:
        return 1.0


@dataclass
class GroupNotSummed(FA2Model):
    """GQA: dK and dV of a K/V head taken from the first query head of its group instead
    of summed over the group."""

    name: str = "bug_bwd_group_not_summed"

    def reduce_group(self, case: Case, per_head: torch.Tensor) -> torch.Tensor:
        return per_head[:, ::case.group_size]


@dataclass
class CausalNotRecomputed(FA2Model):
    """P recomputed in the backward without the causal mask (the forward had it): keys
    past the diagonal get gradient."""

    name: str = "bug_bwd_causal_not_recomputed"

    def backward_scores(self, case: Case, inputs: GradInputs, q: torch.Tensor,
                        k: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int],
                        counter: T.ByteCounter) -> torch.Tensor:
        s = torch.matmul(q, k.transpose(-1, -2)) * self.softmax_scale(case)
        vis = T.tile_visibility(case, inputs, rows, cols, self.causal_offset(case))
        if vis is not None and not case.mask.is_causal:
            s = s.masked_fill(~vis, T.NEG_INF)
        return s

    def sees(self, case: Case, rows: tuple[int, int], key_start: int) -> bool:
        return True  # no tile skipping either: the mask is gone


@dataclass
class NaNOnMaskedRows(FA2Model):
    """P = exp(S - LSE) without the -inf guard: a fully masked row (S and LSE both -inf)
    computes exp(-inf + inf) = NaN."""

    name: str = "bug_bwd_nan_masked_rows"

    def probabilities(self, s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        return torch.exp(s - lse[..., None])


@dataclass
class LostDQUpdate(FA2Model):
    """A race between tiles: the second K/V block's contribution to dQ is lost (two
    programs read the accumulator, both add, one store wins), as when dQ is summed
    without atomics."""

    name: str = "bug_bwd_lost_dq_update"

    def accumulate_dq(self, acc: torch.Tensor, rows: tuple[int, int], update: torch.Tensor,
                      key_start: int) -> None:
        if key_start == self.block_k:
            return  # overwritten by the other program's store
        super().accumulate_dq(acc, rows, update, key_start)


@dataclass
class FirstCallOnly(FA2Model):
    """dQ accumulated into a workspace the backward never zeroes itself: it relies on the
    harness zeroing a variant's workspaces when a case's state is made (once per case,
    harness.candidates.cuda_candidate), so the first call on a case is right and every
    later one adds the previous calls' dQ to its own. It declares its backward
    nondeterministic (dQ by atomics), so a difference between calls is only noted: only
    judging every call against the oracle catches it."""

    name: str = "bug_bwd_first_call_only"
    support: Support = field(default_factory=lambda: Support(
        masked_lse="-inf", backward=True, backward_deterministic=False))
    # (case, accumulator): made zeroed when the case changes, as the harness's workspaces.
    _workspace: tuple[Case, torch.Tensor] | None = field(default=None, repr=False,
                                                          compare=False)

    def dq_accumulator(self, case: Case) -> torch.Tensor:
        if self._workspace is None or self._workspace[0] != case:
            self._workspace = (case, super().dq_accumulator(case))
        return self._workspace[1]


def planted_backward_bugs() -> list[FA2Model]:
    return [DroppedDelta(), MissingScaleInDS(), GroupNotSummed(), CausalNotRecomputed(),
            NaNOnMaskedRows(), LostDQUpdate(), FirstCallOnly()]
