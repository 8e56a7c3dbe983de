"""The serving planted bugs (harness.candidates.models.planted_serving) are caught, and the
`serving` grid catches every planted bug while the correct models pass it.

As in tests/test_planted_bugs.py, each bug is held to its own exposing case and to the
reason (a fragment of the check's message), and where a case exists on which the mistake
is invisible, that control case must pass. Then the table over the grid: every serving
bug, and every dense planted bug that runs serving cases, fails (not errors) on some case
of the `serving` grid, and every correct model passes each grid case it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.candidates.models import (
    FA2Model,
    SplitKVModel,
    all_models,
    planted_bugs,
    planted_serving_bugs,
)
from harness.core.cases import Case, Layout, MaskKind
from harness.core.check import check_case
from harness.core.grids import get_grid
from harness.core.results import Status

F16, BF16 = "float16", "bfloat16"
M = MaskKind
V, P = Layout.VARLEN, Layout.PAGED

DENSE = Case(2, 4, 4, 113, 203, 64, F16, M.NONE)
PAGED = Case(5, 4, 2, 1, 239, 64, F16, M.NONE, layout=P, page_size=16)  # partial pages
PAGED_WHOLE = Case(5, 4, 2, 1, 239, 64, F16, M.NONE, layout=P, page_size=1)  # none partial
VARLEN = Case(6, 4, 4, 113, 203, 64, F16, M.NONE, layout=V)  # padding after every sequence
# Bottom-right causal: a sequence's last row sees up to its last key, never past it.
VARLEN_CAUSAL = Case(6, 4, 4, 113, 203, 64, F16, M.CAUSAL_BR, layout=V)
VARLEN_FULL = Case(3, 4, 4, 113, 203, 64, F16, M.NONE, layout=V, full_lengths=True)  # no gaps
WINDOW = Case(2, 4, 4, 113, 203, 64, F16, M.NONE, window_left=32, window_right=0)
WINDOW_SQUARE = Case(2, 4, 4, 256, 256, 64, F16, M.NONE, window_left=32, window_right=0)
RIGHT_ONLY = Case(2, 4, 4, 113, 203, 64, F16, M.NONE, window_right=8)
LEFT_ONLY = Case(2, 4, 4, 113, 203, 64, F16, M.NONE, window_left=100)
VARLEN_WINDOW = Case(5, 4, 2, 97, 211, 64, BF16, M.NONE, window_left=64, window_right=16,
                     layout=V)


@dataclass(frozen=True)
class Exposure:
    case: Case  # the bug must fail here ...
    reason: str  # ... with this in the check's message
    control: Case | None = None  # and, if given, pass here


EXPOSURES: dict[str, Exposure] = {
    "bug_paged_page_off_by_one": Exposure(PAGED, "out: max error", DENSE),
    "bug_paged_table_ignored": Exposure(PAGED, "out: max error", DENSE),
    "bug_varlen_keys_past_end": Exposure(VARLEN, "out: max error", VARLEN_CAUSAL),
    "bug_varlen_padding_written": Exposure(VARLEN, "padding between packed sequences",
                                           VARLEN_FULL),
    "bug_window_left_off_by_one": Exposure(WINDOW, "out: max error", RIGHT_ONLY),
    "bug_window_right_off_by_one": Exposure(VARLEN_WINDOW, "out: max error", LEFT_ONLY),
    "bug_window_align_swapped": Exposure(WINDOW, "out: max error", WINDOW_SQUARE),
    "bug_splitkv_last_page_dropped": Exposure(PAGED, "out: max error", PAGED_WHOLE),
}
SEEDS = range(3)
# Dense planted bugs the serving grid cannot expose: no serving case has key padding (the
# per-sequence lengths replace it), and the FA1 model runs dense cases only.
NOT_SERVING = {"bug_key_padding_ignored": "no key padding in serving layouts",
               "bug_fa1_max_not_stored": "the FA1 model runs no serving case"}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _bug(name: str):
    return next(b for b in planted_serving_bugs() if b.name == name)


def test_every_serving_bug_has_an_exposing_case():
    names = [b.name for b in planted_serving_bugs()]
    assert len(names) == len(set(names))
    assert not set(names) & {b.name for b in planted_bugs()}
    assert all(n.startswith("bug_") for n in names)
    assert sorted(names) == sorted(EXPOSURES), "each serving bug needs an entry in EXPOSURES"
    for bug in planted_serving_bugs():
        assert bug.kind == "model" and bug.description
        assert bug.supports(EXPOSURES[bug.name].case) is None, bug.name


@pytest.mark.parametrize("name", sorted(EXPOSURES))
def test_serving_bug_is_caught(name: str):
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
def test_serving_bug_is_invisible_on_its_control_case(name: str):
    exposure = EXPOSURES[name]
    result = check_case(_bug(name), exposure.control, device="cpu")
    assert result.status is Status.PASSED, f"{name} on {exposure.control.id}: {result.message}"


def test_the_serving_grid_catches_every_planted_bug():
    """Case-major (the oracle of a case is computed once for every bug still at large),
    stopping when every bug has failed somewhere."""
    bugs = planted_serving_bugs() + [b for b in planted_bugs() if b.name not in NOT_SERVING]
    caught: dict[str, str] = {}
    errors = []
    for case in get_grid("serving"):
        for bug in bugs:
            if bug.name in caught:
                continue
            result = check_case(bug, case, device="cpu")
            if result.status is Status.ERROR:
                errors.append(f"{bug.name} {case.id}: {result.message}")
            elif result.status is Status.FAILED:
                caught[bug.name] = case.id
        if len(caught) == len(bugs):
            break
    assert not errors, "\n".join(errors)
    missed = [b.name for b in bugs if b.name not in caught]
    assert not missed, f"the serving grid passes planted bug(s): {missed}"


def _variants() -> list:
    # Tiles unlike the defaults (block_k 48 straddles every page size of the grid) and
    # forced split counts: 1 (the FA2 path), 3 (uneven), 7 (trailing splits empty).
    return [FA2Model(name="fa2_b16x48", block_q=16, block_k=48),
            SplitKVModel(name="splitkv_1", num_splits=1),
            SplitKVModel(name="splitkv_3", num_splits=3, block_q=16, block_k=48),
            SplitKVModel(name="splitkv_7", num_splits=7, block_k=32)]


# What a correct model may skip a serving case for: it does not declare the layout or the
# window. Everything else it must pass.
SKIP_REASONS = ("layout not supported", "sliding window not supported")


@pytest.mark.parametrize("case", get_grid("serving"), ids=lambda c: c.id)
def test_correct_models_pass_the_serving_grid(case: Case):
    failures, ran = [], []
    for model in all_models() + _variants():
        result = check_case(model, case, device="cpu")
        if result.status is Status.PASSED:
            ran.append(model.name)
        elif not (result.status is Status.SKIPPED
                  and any(r in result.message for r in SKIP_REASONS)):
            failures.append(f"{model.name}: {result.status.value} {result.message}")
    assert not failures, f"{case.id}\n" + "\n".join(failures)
    # split-KV declares every layout and windows: it (and its variants) runs every case.
    assert {"splitkv_model", "splitkv_1", "splitkv_3", "splitkv_7"} <= set(ran), ran
    if case.layout is not Layout.PAGED:
        assert {"fa2_model", "fa2_b16x48"} <= set(ran), ran
