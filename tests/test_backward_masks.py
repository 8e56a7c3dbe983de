"""A backward declares its own mask kinds (`PythonKernel(backward_masks=...)`, a
manifest's `[backward] masks`), defaulting to the forward's: a case under another mask
is skipped with the reason by the backward check and never chosen by the gate's
backward plan; bad values are one message naming the problem."""

from __future__ import annotations

import pytest
from test_backward_protocol import eager  # noqa: I001 - the protocol test's torch attention
from test_manifest_backward import BACKWARD, HEAD, _error, _variant

from harness.candidates.python_candidate import (
    PythonKernel,
    autograd_backward,
    kernels_of,
    to_candidate,
)
from harness.core.cases import Case, MaskKind
from harness.core.check_grad import check_backward_case
from harness.core.grids import get_grid
from harness.core.results import Status
from harness.runs.plan import make_plan
from harness.runs.plan_bwd import plan_backward

M = MaskKind


def _with_masks(value: str) -> str:
    """BACKWARD with `masks = value` in its [backward] table."""
    return BACKWARD.replace("deterministic = true\n", f"deterministic = true\nmasks = {value}\n")

NONE_CASE = Case(2, 4, 2, 33, 47, 32, "float16", M.NONE)
PADDED = Case(3, 4, 4, 21, 37, 32, "float16", M.KEY_PADDING)


def _kernel(**kw) -> PythonKernel:
    return PythonKernel(name="eager_attn", fn=eager, device="cpu",
                        backward_prepare=autograd_backward(eager), **kw)


def test_the_backward_of_an_undeclared_mask_is_skipped_with_the_reason(one_torch_thread):
    cand = to_candidate(_kernel(backward_masks=("none", "causal_br")), "test")
    assert cand.supports(PADDED) is None  # the forward runs it
    res = check_backward_case(cand, PADDED, device="cpu")
    assert res.status is Status.SKIPPED
    assert res.message == ("its backward does not support mask key_padding (declares "
                           "backward masks none, causal_br)")
    assert check_backward_case(cand, NONE_CASE, device="cpu").status is Status.PASSED


def test_by_default_the_backward_runs_the_forwards_masks(one_torch_thread):
    cand = to_candidate(_kernel(), "test")
    assert cand.support.backward_masks is None
    assert cand.backward_unsupported(PADDED) is None
    assert check_backward_case(cand, PADDED, device="cpu").status is Status.PASSED


@pytest.mark.parametrize("kw,fragment", [
    ({"backward_masks": ("none", "causal")}, "backward_masks ('none', 'causal') must be"),
    ({"masks": ("none",), "backward_masks": ("none", "random")}, "among the forward's masks"),
    ({"backward_masks": ()}, "must be a non-empty list"),
    ({"backward_masks": "none"}, "must be a non-empty list"),
])
def test_bad_backward_masks_are_one_line(kw, fragment):
    with pytest.raises(TypeError) as info:
        kernels_of(_kernel(**kw), "tests:bad")
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_backward_masks_without_a_backward_is_refused():
    k = PythonKernel(name="fwd_only", fn=eager, device="cpu", backward_masks=("none",))
    assert k.problems() == ["backward_masks given without a backward"]


def test_a_manifest_backward_declares_its_masks(tmp_path):
    from harness.candidates.variants import load_variant_dir

    head = HEAD.replace('masks = ["none"]', 'masks = ["none", "causal_br", "key_padding"]')
    spec = load_variant_dir(_variant(tmp_path, head + _with_masks('["causal_br"]')))
    assert spec.backward is not None and spec.backward.masks == (M.CAUSAL_BR,)
    support = spec.to_support()
    assert support.backward_masks == frozenset({M.CAUSAL_BR})
    assert support.reason_unsupported_backward(NONE_CASE) == (
        "its backward does not support mask none (declares backward masks causal_br)")
    # without the field: the forward's
    plain = load_variant_dir(_variant(tmp_path / "p", head + BACKWARD))
    assert plain.to_support().backward_masks is None


@pytest.mark.parametrize("value,fragment", [
    ('["random"]', "backward.masks[0]: 'random' is not among supports.masks (none)"),
    ('["none", "diagonal"]', "backward.masks[1]: unknown mask kind 'diagonal'"),
    ('[]', "backward.masks: must not be empty"),
    ('"none"', "backward.masks: must be a list"),
])
def test_bad_manifest_backward_masks_name_the_field(tmp_path, value, fragment):
    msg = _error(tmp_path, HEAD + _with_masks(value))
    assert fragment in msg, msg


class _Cand:
    """A GPU candidate of the gate's plan whose backward runs causal masks only."""

    name, kind, device, isolate = "mine", "cuda", "cuda", True

    def __init__(self) -> None:
        self.meta: dict = {}
        self.support = to_candidate(_kernel(backward_masks=("causal_br", "causal_tl")),
                                    "test").support

    def supports(self, case: Case) -> str | None:
        return None


def test_the_gates_backward_plan_chooses_declared_masks_only():
    mine = _Cand()
    timing = get_grid("perf")
    plan = make_plan([mine], [], timing, owned=["mine"])
    assert any(c.mask is M.NONE for c in plan.timed["mine"])
    plan_backward(plan, [mine], timing, owned=["mine"])
    cases = plan.timed_bwd["mine"]
    assert cases and all(c.mask is M.CAUSAL_BR for c in cases)
