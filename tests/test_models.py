"""The CPU algorithm models: correct on a spread of cases (through the harness's own check),
and their pieces (split-count heuristic, split combine, tile edges) on their own."""

from __future__ import annotations

import math

import pytest
import torch

from harness.candidates.models import all_models, choose_num_splits
from harness.candidates.models.fa1 import FA1Model
from harness.candidates.models.fa2 import FA2Model
from harness.candidates.models.naive import NaiveModel
from harness.candidates.models.splitkv import SplitKVModel, combine_splits, split_chunks
from harness.core.cases import Case, MaskKind, make_inputs
from harness.core.check import check_case
from harness.core.results import Status

F16, BF16 = "float16", "bfloat16"
M = MaskKind

# The spread: odd lengths with partial tiles on both sides, Nq > Nk under both causal
# alignments (bottom-right leaves fully masked rows), key padding whose last batch entry has
# no key at all, a random mask (every 7th row fully masked), GQA and MQA, fp16 and bf16,
# head dims 64, 128 and odd ones (59, 40, 96), single-row decode.
SPREAD = [
    Case(2, 4, 4, 113, 203, 64, F16, M.NONE),
    Case(2, 4, 2, 203, 113, 64, BF16, M.CAUSAL_BR),
    Case(2, 4, 1, 113, 203, 128, F16, M.CAUSAL_TL),
    Case(2, 2, 2, 150, 50, 40, F16, M.CAUSAL_TL),
    Case(3, 2, 2, 1, 239, 64, BF16, M.CAUSAL_BR),
    Case(3, 4, 2, 97, 130, 59, F16, M.KEY_PADDING),
    Case(2, 4, 4, 70, 150, 128, BF16, M.RANDOM),
    Case(2, 6, 2, 64, 64, 64, F16, M.CAUSAL_BR),
    Case(1, 4, 2, 3, 799, 96, F16, M.NONE),
    Case(2, 4, 2, 128, 256, 64, BF16, M.KEY_PADDING),
]
SEEDS = range(20)
VARIANT_SEEDS = 5


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _variants() -> list:
    # The split-KV model with forced split counts: 1 (the FA2 path), 3 (uneven chunks) and
    # 7 (more splits than most cases have K/V tiles, so trailing splits are empty), and
    # FA1/FA2 with tiles unlike the defaults. Checked on the first VARIANT_SEEDS seeds.
    return [
        SplitKVModel(name="splitkv_1", num_splits=1),
        SplitKVModel(name="splitkv_3", num_splits=3),
        SplitKVModel(name="splitkv_7", num_splits=7, block_k=32),
        FA2Model(name="fa2_b16x48", block_q=16, block_k=48),
        FA1Model(name="fa1_b32x16", block_q=32, block_k=16),
    ]


def test_all_models_are_cpu_models_that_write_lse():
    models = all_models()
    assert [m.algorithm for m in models] == ["naive_3pass", "fa1", "fa2", "splitkv"]
    assert len({m.name for m in models}) == len(models)
    for m in models:
        assert (m.kind, m.device) == ("model", "cpu")
        assert m.support.writes_lse and m.support.masked_lse == "-inf"
        assert m.supports(SPREAD[0]) is None


@pytest.mark.parametrize("base", SPREAD, ids=lambda c: c.id)
def test_models_pass_the_check_on_20_seeds(base: Case):
    models, variants = all_models(), _variants()
    failures = []
    for seed in SEEDS:
        case = Case(**{**base.to_dict(), "seed": seed})
        # Case-major: the oracle of a case is computed once for all the models.
        for model in models + (variants if seed < VARIANT_SEEDS else []):
            result = check_case(model, case, device="cpu")
            if result.status is not Status.PASSED:
                failures.append(f"{model.name} {case.id}: {result.status.value} {result.message}")
    assert not failures, "\n".join(failures)


def _ref64(case: Case, inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """A float64 oracle written here, independent of harness.core.reference."""
    g = case.group_size
    q = inputs.q.double()
    k = inputs.k.double().repeat_interleave(g, dim=1)
    v = inputs.v.double().repeat_interleave(g, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(case.head_dim)
    i = torch.arange(case.seqlen_q)[:, None]
    j = torch.arange(case.seqlen_k)[None, :]
    vis = torch.ones(case.seqlen_q, case.seqlen_k, dtype=torch.bool)[None, None]
    if case.mask.is_causal:
        vis = vis & (j <= i + case.causal_offset)
    if inputs.mask is not None:
        vis = vis & inputs.mask
    s = s.masked_fill(~vis, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    return torch.nan_to_num(p) @ v, lse


@pytest.mark.parametrize("model", [NaiveModel(), FA1Model(), FA2Model(),
                                   SplitKVModel(num_splits=5, block_k=16)],
                         ids=lambda m: m.name)
def test_fully_masked_rows_are_exactly_zero_with_lse_minus_inf(model):
    # Bottom-right causal with Nq > Nk: rows 0..Nq-Nk-1 see no key. Key padding: batch 2
    # has no key. Random: every 7th row.
    for case in (Case(1, 2, 1, 90, 40, 32, F16, M.CAUSAL_BR),
                 Case(3, 2, 2, 20, 70, 32, BF16, M.KEY_PADDING),
                 Case(1, 2, 2, 30, 50, 32, F16, M.RANDOM)):
        inputs = make_inputs(case)
        out = torch.full((case.batch, case.heads, case.seqlen_q, case.head_dim), math.nan,
                         dtype=case.torch_dtype)
        lse = torch.full((case.batch, case.heads, case.seqlen_q), math.nan)
        model.run(case, inputs, out, lse)
        ref_out, ref_lse = _ref64(case, inputs)
        masked = torch.isneginf(ref_lse)
        assert masked.any(), case.id
        assert torch.equal(out[masked], torch.zeros_like(out[masked])), case.id
        assert torch.isneginf(lse[masked]).all(), case.id
        assert torch.isfinite(lse[~masked]).all() and torch.isfinite(out).all(), case.id
        assert (out.double() - ref_out).abs().max() < 2e-2, case.id
        assert (lse[~masked].double() - ref_lse[~masked]).abs().max() < 1e-4, case.id


def test_models_count_bytes_of_their_last_run():
    case = Case(1, 2, 2, 40, 70, 32, F16, M.NONE)
    inputs = make_inputs(case)
    for model in all_models():
        assert model.last_bytes is None
        out = torch.empty(1, 2, 40, 32, dtype=torch.float16)
        model.run(case, inputs, out, torch.empty(1, 2, 40))
        first = model.last_bytes.total
        assert first > 0
        bigger = Case(1, 2, 2, 40, 140, 32, F16, M.NONE)
        model.run(bigger, make_inputs(bigger), out, torch.empty(1, 2, 40))
        assert model.last_bytes.total > first, model.name


def test_models_refuse_a_wrongly_shaped_output():
    case = Case(1, 2, 2, 40, 70, 32, F16, M.NONE)
    with pytest.raises(ValueError, match="out has shape"):
        FA2Model().run(case, make_inputs(case), torch.empty(1, 2, 39, 32), None)


# --- split-KV: heuristic and combine ----------------------------------------------------

def test_heuristic_does_not_split_a_full_grid():
    # 4 * 32 * 64 Q blocks of 64 rows: far more programs than 0.8 * 132 SMs.
    assert choose_num_splits(4, 32, 4096, 4096, 64, 132) == 1
    # Exactly at the threshold: 106 programs >= 105.6.
    assert choose_num_splits(106, 1, 1, 8192, 64, 132) == 1


def test_heuristic_worked_examples():
    # Decode, 8 programs, 128 K blocks: the best eligible efficiency is 128/132 = 0.970 at
    # s = 16, 85% of it is 0.824; s = 14 (0.848) is not eligible (ceil(128/14) = ceil(128/13)
    # = 10 blocks per split), so the smallest is s = 15 (0.909).
    assert choose_num_splits(1, 8, 1, 8192, 64, 132) == 15
    # 16 programs, 4 K blocks: efficiencies 16s/132 for s = 1..4; the best is s = 4
    # (0.485), 85% of it is 0.412, which s = 4 alone reaches.
    assert choose_num_splits(2, 4, 113, 203, 64, 132) == 4
    # One K block: nothing to split.
    assert choose_num_splits(1, 1, 1, 64, 64, 132) == 1
    # max_splits caps the count (efficiency 8s/132 grows with s up to the cap).
    assert choose_num_splits(1, 8, 1, 8192, 64, 132, max_splits=4) == 4


def test_heuristic_respects_its_limits():
    for batch, heads, nk in ((1, 1, 100_000), (1, 3, 5000), (2, 5, 700), (1, 32, 131072)):
        s = choose_num_splits(batch, heads, 1, nk, 64, 132, max_splits=128)
        n_blocks = math.ceil(nk / 64)
        assert 1 <= s <= min(128, 132, n_blocks)
        # Only counts that change the blocks per split are chosen (no wasted empty split).
        assert s == 1 or math.ceil(n_blocks / s) != math.ceil(n_blocks / (s - 1))


@pytest.mark.parametrize("bad", ["batch", "seqlen_k", "block_q", "sm_count", "max_splits"])
def test_heuristic_rejects_nonpositive_arguments(bad):
    args = {"batch": 1, "heads": 1, "seqlen_q": 1, "seqlen_k": 10, "block_q": 64,
            "sm_count": 132, "max_splits": 8}
    args[bad] = 0
    with pytest.raises(ValueError, match=bad):
        choose_num_splits(**args)


def test_split_chunks_cover_the_tiles_in_order():
    tiles = [(i, i + 1) for i in range(10)]
    for splits in (1, 2, 3, 5, 17):
        chunks = split_chunks(tiles, splits)
        assert len(chunks) == splits
        assert [t for c in chunks for t in c] == tiles
    assert [len(c) for c in split_chunks(tiles, 3)] == [4, 4, 2]
    assert [len(c) for c in split_chunks(tiles, 17)][10:] == [0] * 7


@pytest.mark.parametrize("splits", [1, 2, 3, 5, 17, 32, 55, 97, 133])
def test_combine_matches_unsplit_softmax_with_empty_splits(splits):
    # Random scores over 400 keys; some rows fully masked; key chunks computed separately
    # (partial O normalised by its own sum, partial LSE, -inf for an empty chunk) must
    # combine into the unsplit result exactly up to float64 rounding.
    gen = torch.Generator().manual_seed(splits)
    rows, nk, d = 12, 400, 8
    s = torch.randn(rows, nk, generator=gen, dtype=torch.float64) * 3
    v = torch.randn(nk, d, generator=gen, dtype=torch.float64)
    vis = torch.rand(rows, nk, generator=gen) < 0.5
    vis[:, 100:260] = False  # whole chunks empty for every row
    vis[4] = False  # a fully masked row
    s = s.masked_fill(~vis, -math.inf)
    bounds = torch.linspace(0, nk, splits + 1).round().long().tolist()
    o_part, lse_part = [], []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        chunk = s[:, a:b]
        lse_s = torch.logsumexp(chunk, dim=-1) if b > a else torch.full((rows,), -math.inf,
                                                                          dtype=torch.float64)
        w = torch.exp(chunk - torch.where(torch.isinf(lse_s), 0.0, lse_s)[:, None])
        o_part.append(torch.nan_to_num(w) @ v[a:b])
        lse_part.append(lse_s)
    o, lse = combine_splits(torch.stack(o_part), torch.stack(lse_part), dim=0)
    want_lse = torch.logsumexp(s, dim=-1)
    want = torch.nan_to_num(torch.exp(s - want_lse[:, None])) @ v
    assert torch.isfinite(o).all()
    assert torch.equal(o[4], torch.zeros(d, dtype=torch.float64))
    assert torch.isneginf(lse[4]) and torch.isneginf(want_lse[4])
    live = torch.isfinite(want_lse)
    assert torch.allclose(lse[live], want_lse[live], atol=1e-12, rtol=0)
    assert torch.allclose(o, want, atol=1e-12, rtol=0)


def test_splitkv_heuristic_model_reports_the_split_it_used():
    model = SplitKVModel()
    case = Case(2, 4, 2, 113, 203, 64, F16, M.NONE)
    out = torch.empty(2, 4, 113, 64, dtype=torch.float16)
    model.run(case, make_inputs(case), out, torch.empty(2, 4, 113))
    assert model.last_splits == choose_num_splits(2, 4, 113, 203, 64, 132) == 4
    assert model.tiles_for(case)["splits"] == 4
    assert model.last_bytes.writes["O_partial"] > 0


def test_negative_split_count_is_refused():
    with pytest.raises(ValueError, match="num_splits"):
        SplitKVModel(num_splits=-1)
