"""CPU algorithm models of the attention kernels, and planted-bug variants of them.

The models (`all_models`) compute attention the way each algorithm's loops do it (naive
3-step, FA1, FA2, split-KV), in float32 from fp16/bf16 inputs, and count the HBM bytes
those loops move (`model.last_bytes` after a run). They pass the harness's correctness
check; the planted bugs (`planted_bugs`) must not. The FA2 and split-KV models also run
the serving case kinds (FA2: varlen batches and sliding windows; split-KV: those and paged
caches), per sequence from the case's index tensors; their planted bugs are
`planted_serving_bugs`. The FA2 and split-KV models apply the score modifiers (softcap,
ALiBi, sinks), run d_v != d_qk and FP8 inputs and KV caches (dequantized tile by tile);
their planted bugs, and those of large inputs, are `planted_mod_bugs`. It also has FA2's backward
(`run_backward`,
harness.candidates.models.fa2_bwd), whose planted bugs are `planted_backward_bugs`.
"""

from __future__ import annotations

from harness.candidates.models.base import ModelCandidate
from harness.candidates.models.fa1 import FA1Model
from harness.candidates.models.fa2 import FA2Model
from harness.candidates.models.naive import NaiveModel
from harness.candidates.models.planted import planted_bugs
from harness.candidates.models.planted_bwd import planted_backward_bugs
from harness.candidates.models.planted_mods import planted_mod_bugs
from harness.candidates.models.planted_serving import planted_serving_bugs
from harness.candidates.models.splitkv import SplitKVModel, choose_num_splits
from harness.candidates.models.tiles import ByteCounter

__all__ = ["ByteCounter", "FA1Model", "FA2Model", "ModelCandidate", "NaiveModel",
           "SplitKVModel", "all_models", "choose_num_splits", "planted_backward_bugs",
           "named_planted_bugs", "planted_bugs", "planted_mod_bugs",
           "planted_serving_bugs"]


def all_models() -> list[ModelCandidate]:
    """One fresh instance of every correct algorithm model, default tiles."""
    return [NaiveModel(), FA1Model(), FA2Model(), SplitKVModel()]


def named_planted_bugs() -> list[ModelCandidate]:
    """The planted bugs `--kernels bug_*` can name: the dense ones, the serving ones
    (which only the serving grid exposes), the score modifiers' (the mods grid) and the
    backward's (`bug_bwd_*`, whose forward is right: `--backward` exposes them)."""
    return [*planted_bugs(), *planted_serving_bugs(), *planted_mod_bugs(),
            *planted_backward_bugs()]
