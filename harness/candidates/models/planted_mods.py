"""Planted bugs of the attention of today's models: the score modifiers (softcap, ALiBi,
sinks), a V head dim of its own (d_v != d_qk), large-magnitude inputs and FP8 descales. FA2 models with
one mistake each in a step those added or stress (harness.core.reference's doc has what
is right; harness.core.distributions the inputs). The `mods` grid exposes every one of them; tests/test_planted_mods.py holds each
to the case that exposes it and to a control case on which it is invisible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.candidates.models import tiles as T
from harness.candidates.models.fa2 import FA2Model, State
from harness.candidates.models.sequences import SeqView
from harness.candidates.models.splitkv import SplitKVModel
from harness.core.cases import Case, Inputs


@dataclass
class SoftcapAfterMask(FA2Model):
    """Soft-capping applied after the mask instead of before it: a masked score, -inf,
    becomes c * tanh(-inf) = -c, a finite logit, so masked keys take part in the softmax
    (and a fully masked row averages V)."""

    name: str = "bug_softcap_after_mask"

    def scores(self, case: Case, inputs: Inputs, q: torch.Tensor, k: torch.Tensor,
               rows: tuple[int, int], cols: tuple[int, int], counter: T.ByteCounter,
               ) -> torch.Tensor:
        s = super().scores(case, inputs, q, k, rows, cols, counter)  # bias, mask: no cap
        return super().cap(case, s)

    def cap(self, case: Case, s: torch.Tensor) -> torch.Tensor:
        return s  # applied at the end of `scores`, after the mask


@dataclass
class SoftcapMissing(FA2Model):
    """The case's softcap ignored: raw scaled scores go into the softmax."""

    name: str = "bug_softcap_missing"

    def cap(self, case: Case, s: torch.Tensor) -> torch.Tensor:
        return s


@dataclass
class AlibiWrongSign(FA2Model):
    """ALiBi bias added as +slope * |i - j|: distant keys favoured instead of penalised."""

    name: str = "bug_alibi_wrong_sign"

    def alibi_bias(self, case: Case, inputs: Inputs, rows: tuple[int, int],
                   cols: tuple[int, int]) -> torch.Tensor | None:
        bias = super().alibi_bias(case, inputs, rows, cols)
        return None if bias is None else -bias


@dataclass
class AlibiTopLeft(FA2Model):
    """ALiBi distances measured from the top-left diagonal (|i - j|) in every case, not
    from the bottom-right one (|i + Nk - Nq - j|) the causal mask and windows use:
    identical when Nq = Nk; under causal with Nq > Nk a per-row constant (O right, the
    LSE shifted); O wrong wherever Nk > Nq."""

    name: str = "bug_alibi_top_left"

    def alibi_offset(self, case: Case) -> int:
        return 0


@dataclass
class SinkNotInLse(FA2Model):
    """The sink normalises O but is left out of the LSE written: log(sum_j e^s_j) instead
    of log(e^sink + sum_j e^s_j), -inf on a row that sees no key."""

    name: str = "bug_sink_not_in_lse"

    def finish_sink(self, o: torch.Tensor, m: torch.Tensor, lsum: torch.Tensor,
                    sink: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, _ = super().finish_sink(o, m, lsum, sink)
        _, lse = self.finish(o, m, lsum)
        return out, lse


@dataclass
class SinkNotInNormalisation(FA2Model):
    """The sink is in the LSE but O is divided by sum_j e^s_j alone: the mass the sink
    should take is spread over the keys' values."""

    name: str = "bug_sink_not_in_normalisation"

    def finish_sink(self, o: torch.Tensor, m: torch.Tensor, lsum: torch.Tensor,
                    sink: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, lse = super().finish_sink(o, m, lsum, sink)
        out, _ = self.finish(o, m, lsum)
        return out, lse


@dataclass
class HeadDimsSwapped(FA2Model):
    """d_v and d_qk swapped in the loop bounds: QK^T's dot products run over d_v columns
    and PV (and O's store) over d_qk. With d_qk = 192, d_v = 128 the scores miss a third
    of each dot product; with d_qk < d_v the last columns of O are never written. Equal
    head dims hide it."""

    name: str = "bug_head_dims_swapped"

    def qk_dim(self, case: Case) -> int:
        return case.dv

    def v_dim(self, case: Case) -> int:
        return case.head_dim


@dataclass
class ScoresInInputDtype(FA2Model):
    """S = QK^T stored in the input dtype before it is scaled (a half-precision staging
    tile): right to the dtype's rounding on N(0, 1) inputs (the naive yardstick does the
    same there), but fp16 overflows to inf where |q . k| > 65504, and inf - inf is NaN."""

    name: str = "bug_scores_in_input_dtype"

    def qk(self, case: Case, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return super().qk(case, q, k).to(case.torch_dtype).float()


@dataclass
class NoRunningMax(FA2Model):
    """Online softmax without the running max: p = exp(s) instead of exp(s - m). Exact
    while the scaled scores stay below ~88, where float32's exp overflows to inf: peaky
    rows of thousands end as inf / inf = NaN."""

    name: str = "bug_no_running_max"

    def online_step(self, state: State, s: torch.Tensor, v: torch.Tensor) -> State:
        o, m, lsum = state
        p = torch.exp(s)
        return o + torch.matmul(p, v), torch.zeros_like(m), lsum + p.sum(dim=-1)


@dataclass
class SplitKVSinkPerSplit(SplitKVModel):
    """Split-KV that folds the sink into every split's partial (each split's program
    applies the epilogue it would without splits) instead of once in the combine: the
    total LSE counts e^sink once per split, and O is weighed down by the extra mass."""

    name: str = "bug_splitkv_sink_per_split"
    num_splits: int = 4

    def finish_split(self, o: torch.Tensor, m: torch.Tensor, lsum: torch.Tensor,
                     sink: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if sink is None:
            return self.finish(o, m, lsum)
        return self.finish_sink(o, m, lsum, sink)

    @staticmethod
    def with_sink(o_part: torch.Tensor, lse_part: torch.Tensor, sink: torch.Tensor | None,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        return o_part, lse_part  # already in every split


@dataclass
class Fp8DescaleTwice(FA2Model):
    """Every FP8 tile multiplied by its descale twice (harness.core.fp8): once where it is
    dequantized and once more, as a kernel that dequantizes its tiles and also scales
    Q K^T by d_q d_k (and O by d_v) does. The scores shrink by d_q d_k (the softmax turns
    nearly uniform) and O by d_v. Cases without fp8 have no descale: invisible there."""

    name: str = "bug_fp8_descale_twice"

    def dequant(self, x: torch.Tensor, descale: torch.Tensor | None) -> torch.Tensor:
        return super().dequant(super().dequant(x, descale), descale)


@dataclass
class Fp8DescaleMissing(FA2Model):
    """The FP8 descales never applied: the raw e4m3 values (up to 448) taken for the
    inputs' values, so the scores grow by 1 / (d_q d_k) and O by 1 / d_v."""

    name: str = "bug_fp8_descale_missing"

    def dequant(self, x: torch.Tensor, descale: torch.Tensor | None) -> torch.Tensor:
        return x


@dataclass
class Fp8PagedScalesUnmapped(SplitKVModel):
    """Split-KV on a paged FP8 cache that reads each key's per-token descale at its
    logical position (page j // page_size of the pool, as if the block table were the
    identity) instead of through the block table, where its key is: every key of a
    shuffled page is dequantized with another token's scale. Per-head descales, dense and
    varlen caches hide it."""

    name: str = "bug_fp8_paged_scales_unmapped"
    num_splits: int = 4

    def slot_descales(self, seq: SeqView, descale: torch.Tensor, logical: torch.Tensor,
                      slots: torch.Tensor) -> torch.Tensor:
        return descale[logical, :, slots].t().unsqueeze(0)


PLANTED_MODS = (SoftcapAfterMask, SoftcapMissing, AlibiWrongSign, AlibiTopLeft, SinkNotInLse,
                SinkNotInNormalisation, HeadDimsSwapped, ScoresInInputDtype, NoRunningMax,
                SplitKVSinkPerSplit, Fp8DescaleTwice, Fp8DescaleMissing,
                Fp8PagedScalesUnmapped)


def planted_mod_bugs() -> list[FA2Model]:  # SplitKVModel is an FA2Model
    """One fresh instance of every planted bug of this module."""
    return [cls(description=" ".join((cls.__doc__ or "").split())) for cls in PLANTED_MODS]
