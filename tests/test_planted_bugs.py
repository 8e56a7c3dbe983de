"""Every planted bug is caught by the harness's check, on the case that exposes it.

Each bug is held to its own exposing case (so a bug that stops being caught fails here,
by name) and to the reason it must be caught (a fragment of the check's message). Where a
case exists on which the bug is invisible, that control case must pass: it shows the
failure comes from the planted mistake and not from something else in the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.candidates.models import planted_bugs
from harness.core.cases import Case, MaskKind
from harness.core.check import check_case
from harness.core.results import Status

F16, BF16 = "float16", "bfloat16"
M = MaskKind

BASIC = Case(2, 4, 4, 113, 203, 64, F16, M.NONE)  # partial Q and K tiles, 4 K/V tiles
NQ_GT_NK_BR = Case(2, 4, 2, 203, 113, 64, BF16, M.CAUSAL_BR)  # rows 0..89 fully masked
SQUARE_CAUSAL = Case(2, 4, 4, 64, 64, 64, F16, M.CAUSAL_BR)
TL_WIDE = Case(2, 4, 4, 113, 203, 64, F16, M.CAUSAL_TL)  # causal, no fully masked row
ONE_KV_TILE = Case(2, 4, 4, 64, 60, 64, F16, M.NONE)
WHOLE_TILES = Case(2, 4, 4, 128, 256, 64, F16, M.NONE)
GQA = Case(2, 4, 2, 113, 203, 64, BF16, M.NONE)
MHA_AND_MQA = Case(2, 4, 1, 113, 203, 64, BF16, M.NONE)
KEY_PADDING = Case(3, 4, 2, 97, 130, 59, F16, M.KEY_PADDING)
CAUSAL_SPLIT_EMPTY = Case(2, 4, 2, 128, 256, 64, F16, M.CAUSAL_BR)  # rows 0..63 miss split 3


@dataclass(frozen=True)
class Exposure:
    case: Case  # the bug must fail here ...
    reason: str  # ... with this in the check's message
    control: Case | None = None  # and, if given, pass here


EXPOSURES: dict[str, Exposure] = {
    "bug_no_inf_guard": Exposure(NQ_GT_NK_BR, "non-finite", BASIC),
    "bug_causal_off_by_one": Exposure(SQUARE_CAUSAL, "out: max error", BASIC),
    "bug_causal_align_swapped": Exposure(TL_WIDE, "out: max error", SQUARE_CAUSAL),
    "bug_no_rescale": Exposure(BASIC, "out: max error", ONE_KV_TILE),
    "bug_no_final_division": Exposure(BASIC, "out: max error"),
    "bug_scale_over_d": Exposure(BASIC, "out: max error"),
    "bug_no_scale": Exposure(BASIC, "out: max error"),
    "bug_partial_key_tile_dropped": Exposure(BASIC, "out: max error", WHOLE_TILES),
    "bug_partial_query_tile_dropped": Exposure(BASIC, "never written", WHOLE_TILES),
    "bug_lse_without_max": Exposure(BASIC, "lse: max error"),
    "bug_gqa_head_modulo": Exposure(GQA, "out: max error", MHA_AND_MQA),
    "bug_key_padding_ignored": Exposure(KEY_PADDING, "out:", BASIC),
    "bug_finite_mask_fill": Exposure(NQ_GT_NK_BR, "fully masked row not exactly 0", TL_WIDE),
    "bug_splitkv_empty_split": Exposure(CAUSAL_SPLIT_EMPTY, "non-finite", BASIC),
    "bug_splitkv_unweighted_combine": Exposure(BASIC, "out: max error", ONE_KV_TILE),
    "bug_fa1_max_not_stored": Exposure(BASIC, "out: max error"),
}
SEEDS = range(3)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _bug(name: str):
    return next(b for b in planted_bugs() if b.name == name)


def test_every_planted_bug_has_an_exposing_case():
    names = [b.name for b in planted_bugs()]
    assert len(names) == len(set(names))
    assert all(n.startswith("bug_") for n in names)
    assert sorted(names) == sorted(EXPOSURES), "each planted bug needs an entry in EXPOSURES"
    for bug in planted_bugs():
        assert bug.kind == "model" and bug.description


@pytest.mark.parametrize("name", sorted(EXPOSURES))
def test_planted_bug_is_caught(name: str):
    exposure = EXPOSURES[name]
    bug = _bug(name)
    for seed in SEEDS:
        case = Case(**{**exposure.case.to_dict(), "seed": seed})
        result = check_case(bug, case, device="cpu")
        assert result.status is Status.FAILED, (
            f"{name} not caught on {case.id}: {result.status.value} {result.message}")
        assert exposure.reason in result.message, (
            f"{name} caught on {case.id} for another reason: {result.message}")


@pytest.mark.parametrize("name", sorted(n for n, e in EXPOSURES.items() if e.control))
def test_planted_bug_is_invisible_on_its_control_case(name: str):
    exposure = EXPOSURES[name]
    result = check_case(_bug(name), exposure.control, device="cpu")
    assert result.status is Status.PASSED, f"{name} on {exposure.control.id}: {result.message}"
