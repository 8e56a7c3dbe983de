"""The CPU models on the serving case kinds (varlen batches, paged caches, sliding
windows): what they declare, correctness through the harness's check on a spread of
cases and seeds, and the pieces a kernel gets right per sequence (only its own rows are
stored, pages come through the block table, fully masked rows are exact)."""

from __future__ import annotations

import math

import pytest
import torch

from harness.candidates.models import FA1Model, FA2Model, NaiveModel, SplitKVModel
from harness.core import serving
from harness.core.cases import Case, Inputs, Layout, MaskKind, make_inputs
from harness.core.check import check_case
from harness.core.results import Status

F16, BF16 = "float16", "bfloat16"
M = MaskKind
V, P = Layout.VARLEN, Layout.PAGED

# Mixed lengths (empty queries, empty caches, single keys, odd lengths), GQA and MQA,
# both causal alignments, windows of every shape, pages from 1 to 128 keys (smaller
# than, straddling and larger than the key tiles), head dims 64, 128 and an odd 59.
SPREAD = [
    Case(6, 4, 2, 37, 53, 64, F16, M.CAUSAL_BR, layout=V),
    Case(11, 4, 1, 70, 150, 59, BF16, M.CAUSAL_TL, layout=V),
    Case(6, 6, 2, 150, 40, 64, F16, M.NONE, window_left=10, window_right=5, layout=V),
    Case(8, 4, 4, 1, 900, 128, BF16, M.NONE, layout=V),
    Case(5, 4, 2, 3, 300, 64, BF16, M.NONE, layout=P, page_size=32),
    Case(6, 4, 1, 20, 141, 64, F16, M.CAUSAL_BR, layout=P, page_size=1),
    Case(5, 4, 2, 90, 70, 64, F16, M.CAUSAL_TL, window_left=7, layout=P, page_size=48),
    Case(3, 4, 4, 1, 1000, 64, BF16, M.NONE, window_left=200, layout=P, page_size=128),
    Case(2, 4, 2, 203, 113, 64, F16, M.CAUSAL_BR, window_left=0, window_right=0),
    Case(2, 4, 4, 97, 130, 64, BF16, M.KEY_PADDING, window_left=30, window_right=3),
    Case(2, 4, 4, 70, 150, 64, F16, M.RANDOM, window_right=40),
]
SEEDS = range(5)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _models() -> list:
    return [FA2Model(), SplitKVModel(), FA2Model(name="fa2_b16x48", block_q=16, block_k=48),
            SplitKVModel(name="splitkv_1", num_splits=1),
            SplitKVModel(name="splitkv_5", num_splits=5, block_k=16)]


def _buffers(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    shape = serving.tensor_shapes(case)["out"]
    return (torch.full(shape, math.nan, dtype=case.torch_dtype),
            torch.full(shape[:3], math.nan))


def test_the_models_declare_what_they_run():
    fa2, split = FA2Model().support, SplitKVModel().support
    assert fa2.layouts == {Layout.DENSE, Layout.VARLEN} and fa2.window
    assert split.layouts == set(Layout) and split.window
    for model in (NaiveModel(), FA1Model()):
        assert model.support.layouts == {Layout.DENSE} and not model.support.window
        assert "varlen layout not supported" in model.supports(SPREAD[0])
        assert "sliding window" in model.supports(SPREAD[-1])
    assert "paged layout not supported" in FA2Model().supports(SPREAD[4])
    # The backward model is dense without a window: it says so instead of running.
    for case in (SPREAD[0], SPREAD[-1]):
        assert "dense cases without a sliding window" in FA2Model().supports_backward(case)
    assert FA2Model().supports_backward(Case(1, 2, 2, 16, 16, 64)) is None


@pytest.mark.parametrize("base", SPREAD, ids=lambda c: c.id)
def test_models_pass_the_check_on_serving_cases(base: Case):
    failures = []
    for seed in SEEDS:
        case = Case(**{**base.to_dict(), "seed": seed})
        for model in _models():
            if model.supports(case) is not None:
                continue
            result = check_case(model, case, device="cpu")
            if result.status is not Status.PASSED:
                failures.append(f"{model.name} {case.id}: {result.status.value} "
                                f"{result.message}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("model", [FA2Model(), SplitKVModel(num_splits=3, block_k=16)],
                         ids=lambda m: m.name)
def test_only_the_sequences_rows_are_written(model):
    # Padding rows keep their NaN; a sequence with an empty cache is exactly 0 / -inf.
    case = Case(6, 4, 2, 37, 53, 64, F16, M.CAUSAL_BR, layout=V)
    out, lse = _buffers(case)
    model.run(case, make_inputs(case), out, lse)
    valid = serving.row_valid(case)
    assert not valid.all()
    assert torch.isnan(out[:, :, ~valid]).all() and torch.isnan(lse[:, :, ~valid]).all()
    assert not torch.isnan(out[:, :, valid]).any()
    pl = serving.placement(case)
    empty = [b for b, (q, k) in enumerate(zip(pl.q_lens, pl.k_lens, strict=True))
             if q and not k]
    assert empty, "the case needs a sequence with an empty cache"
    for b in empty:
        rows = slice(pl.q_starts[b], pl.q_starts[b] + pl.q_lens[b])
        assert torch.equal(out[:, :, rows], torch.zeros_like(out[:, :, rows]))
        assert torch.isneginf(lse[:, :, rows]).all()


def test_paged_keys_come_through_the_block_table():
    # Relabel the pool's pages (and the table with them): the same keys, so bitwise the
    # same output. A model that read pages by position would change its answer.
    case = Case(5, 4, 2, 3, 300, 64, BF16, M.CAUSAL_TL, window_left=40, layout=P,
                page_size=32)
    inputs = make_inputs(case)
    perm = torch.randperm(inputs.k.shape[0], generator=torch.Generator().manual_seed(1))
    inverse = torch.argsort(perm)
    index = serving.ServingIndex(inputs.serving.seqlens_q, inputs.serving.seqlens_k,
                                 block_table=inverse[inputs.serving.block_table.long()]
                                 .to(torch.int32))
    moved = Inputs(inputs.q, inputs.k[perm], inputs.v[perm], serving=index)
    model = SplitKVModel(num_splits=2)
    out_a, lse_a = _buffers(case)
    out_b, lse_b = _buffers(case)
    model.run(case, inputs, out_a, lse_a)
    model.run(case, moved, out_b, lse_b)
    assert torch.equal(out_a, out_b) and torch.equal(lse_a, lse_b)
    # ... and with the table left as it was, the relabelled pool gives other keys.
    stale = Inputs(inputs.q, inputs.k[perm], inputs.v[perm], serving=inputs.serving)
    out_c, lse_c = _buffers(case)
    model.run(case, stale, out_c, lse_c)
    assert not torch.equal(out_a, out_c)


def test_a_varlen_output_must_have_the_packed_shape():
    case = SPREAD[0]
    with pytest.raises(ValueError, match="out has shape"):
        FA2Model().run(case, make_inputs(case),
                       torch.empty(case.batch, case.heads, case.seqlen_q, case.head_dim), None)
