"""The bytes the models' tile loops count, held against the IO model (harness.core.iomodel).

The loops count every tile load and store as they do it; the IO model is a closed form.
They must agree term by term: exactly for every mask kind the IO model covers (no mask,
both causal alignments with whole-tile skipping, key padding, which is applied inside
loaded tiles). Arbitrary masks add the mask tiles the loops read, a term the IO model does
not carry.

Two differences are the models' own and are stated here rather than hidden:
- the naive model writes LSE (the IO model's naive algorithm produces only O): + B*H*Nq*4;
- FA1 keeps O in a float32 HBM workspace (`tiles["acc_bytes"]`; an fp16 O re-rounded
  after every K/V block fails the tolerance) and ends with an epilogue (read O, m, l;
  write O in the input dtype and LSE). Where the IO model already honours `acc_bytes` or
  writes LSE for FA1, the adjustment is not applied twice.

Sliding windows and the serving layouts (varlen, paged) are held to the IO model the
same way: the FA2 and split-KV models count the key tiles each row block's windows
reach, per sequence, and the IO model sums its per-sequence dense terms.
"""

from __future__ import annotations

import pytest
import torch

from harness.candidates.models import all_models
from harness.candidates.models.fa1 import FA1Model
from harness.candidates.models.fa2 import FA2Model
from harness.candidates.models.naive import NaiveModel
from harness.candidates.models.splitkv import SplitKVModel
from harness.candidates.models.tiles import F32_BYTES, ByteCounter
from harness.core import iomodel, serving
from harness.core.cases import Case, Layout, MaskKind, make_inputs

F16, BF16 = "float16", "bfloat16"
M = MaskKind

CASES = [
    Case(2, 4, 4, 113, 203, 64, F16, M.NONE),
    Case(1, 4, 2, 256, 512, 128, BF16, M.NONE),
    Case(2, 4, 1, 1, 239, 64, F16, M.NONE),
    Case(1, 2, 2, 203, 113, 40, BF16, M.NONE),
    Case(2, 4, 2, 203, 113, 64, F16, M.CAUSAL_BR),
    Case(1, 4, 4, 113, 203, 64, BF16, M.CAUSAL_BR),
    Case(2, 2, 2, 113, 203, 64, F16, M.CAUSAL_TL),
    Case(1, 2, 2, 200, 70, 32, F16, M.CAUSAL_TL),
    Case(3, 4, 2, 97, 130, 59, F16, M.KEY_PADDING),
]


def _models() -> list:
    return all_models() + [
        FA2Model(name="fa2_b16x48", block_q=16, block_k=48),
        FA2Model(name="fa2_b128x32", block_q=128, block_k=32),
        FA1Model(name="fa1_b32x16", block_q=32, block_k=16),
        SplitKVModel(name="splitkv_1", num_splits=1),
        SplitKVModel(name="splitkv_3", num_splits=3),
        SplitKVModel(name="splitkv_9", num_splits=9, block_k=32),  # some splits empty
    ]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# Model counter names -> IO model term names.
_READ = {"Q": "read Q", "K": "read K", "V": "read V", "S": "read S", "P": "read P",
         "O": "read O", "m": "read m,l", "l": "read m,l", "O_partial": "read partials",
         "LSE_partial": "read partials", "mask": "read mask"}
_WRITE = {"O": "write O", "LSE": "write LSE", "S": "write S", "P": "write P",
          "m": "write m,l", "l": "write m,l", "O_partial": "write partials",
          "LSE_partial": "write partials"}


def model_terms(counter: ByteCounter) -> dict[str, int]:
    terms: dict[str, int] = {}
    for table, counts in ((_READ, counter.reads), (_WRITE, counter.writes)):
        for name, nbytes in counts.items():
            terms[table[name]] = terms.get(table[name], 0) + nbytes
    return terms


def tiles_of(model, case: Case) -> dict:
    return model.tiles_for(case) if hasattr(model, "tiles_for") else model.tiles


def expected_terms(model, case: Case) -> dict[str, int]:
    """The IO model's terms plus the documented differences (module docstring)."""
    tiles = tiles_of(model, case)
    io = iomodel.hbm_breakdown(model.algorithm, case, tiles)
    rows = case.batch * case.heads * case.seqlen_q
    es = case.torch_dtype.itemsize
    if model.algorithm == "naive_3pass" and "write LSE" not in io:
        io["write LSE"] = rows * F32_BYTES
    if model.algorithm == "fa1":
        acc = tiles["acc_bytes"]
        plain = iomodel.hbm_breakdown("fa1", case, {k: v for k, v in tiles.items()
                                                    if k != "acc_bytes"})
        if io == plain and acc != es:  # the IO model counts the O workspace at es
            io["read O"] = io["read O"] // es * acc
            io["write O"] = io["write O"] // es * acc
        if "write LSE" not in io:  # the epilogue
            io["read O"] += rows * case.head_dim * acc
            io["write O"] += rows * case.head_dim * es
            io["read m,l"] += 2 * rows * F32_BYTES
            io["write LSE"] = rows * F32_BYTES
    return {k: v for k, v in io.items() if v}


def _run(model, case: Case) -> ByteCounter:
    shape = serving.tensor_shapes(case)["out"]
    out = torch.empty(shape, dtype=case.torch_dtype)
    model.run(case, make_inputs(case), out, torch.empty(shape[:3]))
    return model.last_bytes


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_model_bytes_match_the_io_model(case: Case):
    mismatches = []
    for model in _models():
        got = model_terms(_run(model, case))
        want = expected_terms(model, case)
        if got != want:
            mismatches.append(f"{model.name}: counted {got}\n    io model {want}")
    assert not mismatches, f"{case.id}\n" + "\n".join(mismatches)


def test_unmasked_totals_equal_hbm_bytes_for_fa2_and_splitkv():
    # The two algorithms the models count with no documented difference at all.
    case = Case(2, 4, 2, 300, 500, 64, F16, M.NONE)
    for model in (FA2Model(), SplitKVModel(num_splits=4), SplitKVModel()):
        total = _run(model, case).total
        assert total == iomodel.hbm_bytes(model.algorithm, case, tiles_of(model, case)), model


def test_causal_tile_skipping_moves_fewer_bytes_than_no_skipping():
    # A bottom-right causal square skips about half the (Q block, K/V block) pairs: the
    # re-read operand (K for FA2 and split-KV, Q for FA1) drops to about 9/16 of the
    # unmasked count with 8 blocks a side.
    causal = Case(1, 2, 2, 512, 512, 64, F16, M.CAUSAL_BR)
    full = Case(1, 2, 2, 512, 512, 64, F16, M.NONE)
    for model, reread in ((FA2Model(), "K"), (FA1Model(), "Q"),
                          (SplitKVModel(num_splits=2), "K")):
        c, f = _run(model, causal), _run(model, full)
        assert c.reads[reread] == f.reads[reread] * 9 // 16, model.name
        assert c.total < f.total, model.name


def test_random_mask_adds_only_the_mask_tiles():
    case = Case(2, 2, 2, 70, 150, 64, BF16, M.RANDOM)
    for model in (NaiveModel(), FA2Model(), FA1Model(), SplitKVModel(num_splits=3)):
        terms = model_terms(_run(model, case))
        mask = terms.pop("read mask")
        # Every (b, h) program reads each mask element of the tiles it visits once.
        assert mask == case.batch * case.heads * case.seqlen_q * case.seqlen_k, model.name
        assert terms == expected_terms(model, case), model.name



V, P = Layout.VARLEN, Layout.PAGED
# Windows on dense cases (with key padding and a random mask too), varlen batches with and
# without windows, paged caches whose pages are smaller than, equal to and larger than the
# key tiles, decode-like and prefill-like queries, mixed and full lengths.
SERVING_CASES = [
    Case(2, 4, 2, 113, 203, 64, F16, M.NONE, window_left=32, window_right=0),
    Case(2, 4, 4, 203, 113, 64, BF16, M.CAUSAL_BR, window_left=64),
    Case(1, 4, 1, 256, 256, 128, F16, M.CAUSAL_TL, window_left=0, window_right=0),
    Case(2, 4, 4, 97, 130, 64, F16, M.KEY_PADDING, window_left=20, window_right=7),
    Case(6, 4, 2, 113, 203, 64, F16, M.NONE, layout=V),
    Case(6, 4, 4, 128, 217, 128, BF16, M.CAUSAL_BR, layout=V),
    Case(5, 6, 2, 97, 211, 64, F16, M.CAUSAL_TL, window_left=64, window_right=16, layout=V),
    Case(3, 4, 4, 113, 203, 64, F16, M.NONE, layout=V, full_lengths=True),
    Case(5, 4, 2, 1, 239, 64, F16, M.NONE, layout=P, page_size=16),
    Case(5, 6, 2, 16, 1024, 64, BF16, M.CAUSAL_BR, layout=P, page_size=256),
    Case(5, 4, 1, 64, 97, 128, F16, M.CAUSAL_TL, layout=P, page_size=16),
    Case(4, 4, 2, 3, 500, 64, F16, M.NONE, window_left=100, layout=P, page_size=64),
    Case(2, 4, 4, 1, 4096, 64, BF16, M.NONE, layout=P, page_size=64, full_lengths=True),
]


def _serving_models() -> list:
    return [FA2Model(), FA2Model(name="fa2_b16x48", block_q=16, block_k=48), SplitKVModel(),
            SplitKVModel(name="splitkv_1", num_splits=1),
            SplitKVModel(name="splitkv_3", num_splits=3),
            SplitKVModel(name="splitkv_9", num_splits=9, block_k=32)]


def serving_expected_terms(model, case: Case) -> dict[str, int]:
    """`expected_terms`: serving cases have no difference of their own (an empty cache
    writes its zero O and -inf LSE in the IO model too)."""
    return expected_terms(model, case)


@pytest.mark.parametrize("case", SERVING_CASES, ids=lambda c: c.id)
def test_serving_model_bytes_match_the_io_model(case: Case):
    mismatches, ran = [], 0
    for model in _serving_models():
        if model.supports(case) is not None:
            continue
        ran += 1
        terms = model_terms(_run(model, case))
        terms.pop("read mask", None)  # the random mask's tiles: not in the IO model
        want = serving_expected_terms(model, case)
        if terms != want:
            mismatches.append(f"{model.name}: counted {terms}\n    io model {want}")
    assert ran >= 4, f"{case.id}: only {ran} models ran it"
    assert not mismatches, f"{case.id}\n" + "\n".join(mismatches)


def test_window_and_sequence_tiles_move_fewer_bytes():
    # Key tiles outside every row's window are skipped: a 32-key causal window over 1024
    # keys reads a few tiles per row block, not the whole causal triangle; a varlen batch
    # of mixed lengths reads less than the same shape at full lengths.
    windowed = Case(1, 2, 2, 1024, 1024, 64, F16, M.CAUSAL_BR, window_left=32)
    causal = Case(1, 2, 2, 1024, 1024, 64, F16, M.CAUSAL_BR)
    for model in (FA2Model(), SplitKVModel(num_splits=2)):
        w, c = _run(model, windowed), _run(model, causal)
        # 16 row blocks of 64 rows, each reaching back 32 keys: 2 tiles (the first one 1).
        assert w.reads["K"] == 1 * 2 * (1 + 15 * 2) * 64 * 64 * 2, model.name
        assert c.reads["K"] > 4 * w.reads["K"], model.name
    mixed = Case(6, 4, 4, 113, 203, 64, F16, M.NONE, layout=V)
    full = Case(6, 4, 4, 113, 203, 64, F16, M.NONE, layout=V, full_lengths=True)
    assert _run(FA2Model(), mixed).total < _run(FA2Model(), full).total
