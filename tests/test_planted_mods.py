"""Every planted score-modifier bug (harness.candidates.models.planted_mods) is caught by
the harness's check on the case that exposes it, for the reason it must be, and passes on
a control case where its mistake is invisible (as in tests/test_planted_bugs.py); and the
mods grid exposes every one of them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.candidates.models import FA2Model, SplitKVModel, planted_bugs, planted_mod_bugs
from harness.core.cases import Case, Dist, Fp8, Layout, MaskKind
from harness.core.check import check_case
from harness.core.grids import get_grid
from harness.core.results import Status

F16, BF16 = "float16", "bfloat16"
M = MaskKind

PLAIN = Case(2, 4, 2, 113, 203, 64, F16, M.NONE)
SOFTCAP = Case(2, 4, 2, 113, 203, 64, F16, M.NONE, softcap=5.0)
# Rows 0..89 see no key: a cap after the mask turns their -inf into -5.
SOFTCAP_MASKED = Case(2, 4, 2, 203, 113, 64, BF16, M.CAUSAL_BR, softcap=5.0)
ALIBI = Case(2, 4, 2, 113, 203, 64, F16, M.NONE, alibi=True)
ALIBI_CAUSAL_WIDE = Case(2, 4, 2, 113, 203, 64, F16, M.CAUSAL_BR, alibi=True)  # Nk > Nq
ALIBI_SQUARE = Case(2, 4, 4, 128, 128, 64, F16, M.CAUSAL_BR, alibi=True)
# Top-left causal: the first rows see a few keys, beside which any sink weighs.
SINKS = Case(2, 4, 2, 113, 203, 64, F16, M.CAUSAL_TL, sinks=True)
MLA = Case(2, 4, 2, 113, 203, 192, F16, M.CAUSAL_BR, head_dim_v=128)  # d_qk > d_v
V_WIDER = Case(2, 4, 2, 113, 203, 128, BF16, M.NONE, head_dim_v=192)  # d_qk < d_v
D192 = Case(2, 4, 2, 113, 203, 192, F16, M.CAUSAL_BR)
LARGE = Case(2, 4, 4, 113, 203, 64, F16, M.NONE, dist=Dist.LARGE)  # |q . k| past fp16's range
LARGE_BF16 = Case(2, 4, 2, 203, 113, 64, BF16, M.CAUSAL_BR, dist=Dist.LARGE)
OUTLIERS = Case(2, 4, 4, 113, 203, 64, F16, M.NONE, dist=Dist.OUTLIERS)
FP8_QKV = Case(2, 4, 2, 203, 113, 64, BF16, M.CAUSAL_BR, fp8=Fp8.QKV_HEAD)
FP8_KV = Case(4, 8, 2, 4, 300, 64, F16, M.CAUSAL_BR, fp8=Fp8.KV_TOKEN)  # Q in fp16
PAGED_FP8_TOKEN = Case(5, 4, 2, 1, 239, 64, F16, M.NONE, layout=Layout.PAGED, page_size=16,
                       fp8=Fp8.KV_TOKEN)
PAGED_FP8_HEAD = Case(5, 4, 2, 1, 239, 64, F16, M.NONE, layout=Layout.PAGED, page_size=16,
                      fp8=Fp8.KV_HEAD)


@dataclass(frozen=True)
class Exposure:
    case: Case  # the bug must fail here ...
    reason: str  # ... with this in the check's message
    control: Case  # and pass here


EXPOSURES: dict[str, Exposure] = {
    "bug_softcap_after_mask": Exposure(SOFTCAP_MASKED, "fully masked row not exactly 0",
                                       SOFTCAP),
    "bug_softcap_missing": Exposure(SOFTCAP, "out: max error", ALIBI),
    "bug_alibi_wrong_sign": Exposure(ALIBI, "out: max error", SOFTCAP),
    "bug_alibi_top_left": Exposure(ALIBI_CAUSAL_WIDE, "out: max error", ALIBI_SQUARE),
    "bug_sink_not_in_lse": Exposure(SINKS, "lse: max error", PLAIN),
    "bug_sink_not_in_normalisation": Exposure(SINKS, "out: max error", PLAIN),
    "bug_head_dims_swapped": Exposure(MLA, "out: max error", D192),
    "bug_scores_in_input_dtype": Exposure(LARGE, "non-finite", OUTLIERS),
    "bug_no_running_max": Exposure(LARGE_BF16, "non-finite", OUTLIERS),
    "bug_splitkv_sink_per_split": Exposure(SINKS, "out: max error", PLAIN),
    "bug_fp8_descale_twice": Exposure(FP8_QKV, "out: max error", PLAIN),
    "bug_fp8_descale_missing": Exposure(FP8_KV, "out: max error", PLAIN),
    "bug_fp8_paged_scales_unmapped": Exposure(PAGED_FP8_TOKEN, "out: max error",
                                              PAGED_FP8_HEAD),
}
SEEDS = range(3)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _bug(name: str) -> FA2Model:
    return next(b for b in planted_mod_bugs() if b.name == name)


def test_every_planted_mod_bug_has_an_exposing_case():
    names = [b.name for b in planted_mod_bugs()]
    assert len(names) == len(set(names)) and sorted(names) == sorted(EXPOSURES)
    assert not set(names) & {b.name for b in planted_bugs()}
    for bug in planted_mod_bugs():
        assert bug.kind == "model" and bug.description and bug.name.startswith("bug_")


@pytest.mark.parametrize("name", sorted(EXPOSURES))
def test_planted_mod_bug_is_caught(name: str):
    exposure = EXPOSURES[name]
    for seed in SEEDS:
        case = Case(**{**exposure.case.to_dict(), "seed": seed})
        result = check_case(_bug(name), case, device="cpu")
        assert result.status is Status.FAILED, (
            f"{name} not caught on {case.id}: {result.status.value} {result.message}")
        assert exposure.reason in result.message, (
            f"{name} caught on {case.id} for another reason: {result.message}")


@pytest.mark.parametrize("name", sorted(EXPOSURES))
def test_planted_mod_bug_is_invisible_on_its_control_case(name: str):
    exposure = EXPOSURES[name]
    for model in (_bug(name), FA2Model(), SplitKVModel(num_splits=4)):
        if model.supports(exposure.control):  # the FA2 model reads no paged cache
            continue
        result = check_case(model, exposure.control, device="cpu")
        assert result.status is Status.PASSED, f"{model.name} on {exposure.control.id}: " \
                                               f"{result.message}"
    # The correct models pass where the bug fails.
    for model in (FA2Model(), SplitKVModel(num_splits=4)):
        if model.supports(exposure.case):
            continue
        result = check_case(model, exposure.case, device="cpu")
        assert result.status is Status.PASSED, (model.name, result.message)


def test_head_dims_swapped_leaves_columns_unwritten_when_d_v_is_wider():
    result = check_case(_bug("bug_head_dims_swapped"), V_WIDER, device="cpu")
    assert result.status is Status.FAILED and "never written" in result.message, \
        result.message
    assert check_case(FA2Model(), V_WIDER, device="cpu").status is Status.PASSED


def test_scores_in_bf16_are_caught_on_large_inputs_too():
    # No overflow in bf16, but S of ~1e5 rounded to 8 bits moves scores by hundreds.
    result = check_case(_bug("bug_scores_in_input_dtype"), LARGE_BF16, device="cpu")
    assert result.status is Status.FAILED and "out: max error" in result.message


def test_the_mods_grid_catches_every_planted_mod_bug():
    """Case-major, stopping when every bug has failed somewhere."""
    bugs = planted_mod_bugs()
    caught: dict[str, str] = {}
    for case in get_grid("mods"):
        for bug in bugs:
            if bug.name not in caught and check_case(bug, case, device="cpu").status \
                    is Status.FAILED:
                caught[bug.name] = case.id
        if len(caught) == len(bugs):
            break
    missed = [b.name for b in bugs if b.name not in caught]
    assert not missed, f"the mods grid passes planted bug(s): {missed}"


@pytest.mark.parametrize("name", ["bug_fp8_descale_twice", "bug_fp8_descale_missing"])
def test_fp8_descale_bugs_are_caught_on_either_kind_of_fp8_case(name: str):
    for case in (FP8_QKV, FP8_KV, Case(1, 8, 2, 1, 239, 128, BF16, M.NONE, fp8=Fp8.KV_HEAD),
                 Case(2, 4, 4, 113, 203, 64, F16, M.NONE, fp8=Fp8.QKV_TENSOR)):
        result = check_case(_bug(name), case, device="cpu")
        assert result.status is Status.FAILED and "out: max error" in result.message, \
            (case.id, result.message)
