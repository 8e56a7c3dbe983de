"""Head dims a variant declares beyond one list: the head dims its backward runs
(`[backward] head_dims`, `PythonKernel(backward_head_dims=...)`), the (d_qk, d_v) pairs
it runs (`head_dim_v = [[192, 128]]`), and the size expressions that pick a launch by
head dim (`head_dim == 256`, `head_dim_v`). Bad values are one message naming the
field."""

from __future__ import annotations

import pytest
from test_backward_protocol import eager  # noqa: I001 - the protocol test's torch attention
from test_manifest_backward import BACKWARD, HEAD, _error, _variant

from harness.candidates.expr import ExprError, parse_expr
from harness.candidates.python_candidate import PythonKernel, autograd_backward, to_candidate
from harness.candidates.variant_spec import size_env
from harness.candidates.variants import load_variant_dir
from harness.core.cases import Case, MaskKind
from harness.core.check_grad import check_backward_case
from harness.core.results import Status

M = MaskKind
TWO_DIMS = HEAD.replace("head_dims = [64]", "head_dims = [64, 128]").replace(
    'entry = "v_fwd_{dtype}"', 'entry = "v_fwd_{dtype}_d{head_dim}"')
BWD_D = BACKWARD.replace('entry = "v_bwd_{dtype}"', 'entry = "v_bwd_{dtype}_d{head_dim}"')


def _bwd_dims(value: str) -> str:
    return BWD_D.replace("deterministic = true\n", f"deterministic = true\nhead_dims = {value}\n")


# --- size expressions -----------------------------------------------------------------
@pytest.mark.parametrize("text,env,want", [
    ("head_dim == 256", {"head_dim": 256}, 1),
    ("head_dim == 256", {"head_dim": 128}, 0),
    ("(head_dim != 64) * 3", {"head_dim": 128}, 3),
    ("80 * (head_dim == 256) + 128 * (head_dim < 256)", {"head_dim": 256}, 80),
    ("80 * (head_dim == 256) + 128 * (head_dim < 256)", {"head_dim": 64}, 128),
    ("64 < head_dim <= 192", {"head_dim": 192}, 1),   # chained as Python chains
    ("64 < head_dim <= 192", {"head_dim": 256}, 0),
    ("64 < head_dim <= 192", {"head_dim": 64}, 0),
    ("(head_dim >= 128) + (head_dim > 128)", {"head_dim": 128}, 1),
    ("head_dim_v == head_dim", {"head_dim": 192, "head_dim_v": 128}, 0),
])
def test_comparisons_are_one_or_zero(text, env, want):
    assert parse_expr(text).evaluate(env) == want


@pytest.mark.parametrize("text,fragment", [
    ("head_dim in 64", "operator In not allowed"),
    ("head_dim is 64", "operator Is not allowed"),
    ("head_dim == 64 and causal", "BoolOp not allowed"),
])
def test_other_tests_stay_refused(text, fragment):
    with pytest.raises(ExprError) as info:
        parse_expr(text)
    assert fragment in str(info.value)


def test_head_dim_v_is_a_size_name(tmp_path):
    assert size_env(Case(1, 2, 2, 16, 16, 192, head_dim_v=128))["head_dim_v"] == 128
    assert size_env(Case(1, 2, 2, 16, 16, 64))["head_dim_v"] == 64
    spec = load_variant_dir(_variant(
        tmp_path, HEAD.replace('grid = ["seqlen_q"', 'grid = ["seqlen_q * (head_dim_v == head_dim)"')))
    assert spec.launches[0].grid[0].names == frozenset({"seqlen_q", "head_dim_v", "head_dim"})


# --- [backward] head_dims -------------------------------------------------------------
def test_a_backward_declares_its_head_dims_and_its_entries_follow(tmp_path):
    spec = load_variant_dir(_variant(tmp_path, TWO_DIMS + _bwd_dims("[64]")))
    assert spec.backward is not None and spec.backward.head_dims == (64,)
    # the module holds the forward's entries at both head dims, the backward's at 64 only
    assert spec.entry_names() == ["v_fwd_fp16_d64", "v_bwd_fp16_d64", "v_fwd_fp16_d128"]
    support = spec.to_support()
    assert support.backward_head_dims == frozenset({64})
    d128 = Case(1, 2, 2, 16, 16, 128, "float16", M.NONE)
    assert support.reason_unsupported(d128) is None   # the forward runs it
    assert support.reason_unsupported_backward(d128) == (
        "its backward does not support head_dim 128 (declares backward head dims 64)")
    assert support.reason_unsupported_backward(Case(1, 2, 2, 16, 16, 64)) is None
    # without the field: the forward's, and every entry at every head dim
    plain = load_variant_dir(_variant(tmp_path / "p", TWO_DIMS + BWD_D))
    assert plain.to_support().backward_head_dims is None
    assert plain.entry_names() == ["v_fwd_fp16_d64", "v_bwd_fp16_d64", "v_fwd_fp16_d128",
                                   "v_bwd_fp16_d128"]


def test_a_backward_of_fewer_head_dims_skips_a_dv_case_outside_them():
    from harness.core.candidate import Support

    s = Support(head_dims=frozenset({128, 192}), head_dim_v=True, backward=True,
                backward_head_dims=frozenset({128, 192}))
    assert s.reason_unsupported_backward(Case(1, 2, 2, 16, 16, 192, head_dim_v=128)) is None
    s = Support(head_dims=frozenset({128, 192}), head_dim_v=True, backward=True,
                backward_head_dims=frozenset({192}))
    assert "head_dim 128" in s.reason_unsupported_backward(
        Case(1, 2, 2, 16, 16, 192, head_dim_v=128))


@pytest.mark.parametrize("value,fragment", [
    ("[256]", "backward.head_dims[0]: 256 is not among supports.head_dims (64, 128)"),
    ("[64, 64]", "backward.head_dims[1]: 64 is listed twice"),
    ("[]", "backward.head_dims: must not be empty"),
    ('"64"', "backward.head_dims: must be a list"),
    ('["64"]', "backward.head_dims[0]"),
])
def test_bad_backward_head_dims_name_the_field(tmp_path, value, fragment):
    msg = _error(tmp_path, TWO_DIMS + _bwd_dims(value))
    assert fragment in msg and "\n" not in msg, msg


def test_backward_head_dims_need_a_list_of_head_dims(tmp_path):
    head = HEAD.replace("head_dims = [64]", 'head_dims = "any"\nmax_head_dim = 256')
    msg = _error(tmp_path, head + BACKWARD.replace(
        "deterministic = true\n", "deterministic = true\nhead_dims = [64]\n"))
    assert "backward.head_dims: needs supports.head_dims as a list" in msg, msg


def _py(**kw) -> PythonKernel:
    return PythonKernel(name="eager_attn", fn=eager, device="cpu",
                        backward_prepare=autograd_backward(eager), **kw)


def test_a_python_kernels_backward_declares_its_head_dims(one_torch_thread):
    cand = to_candidate(_py(head_dims=(32, 64), backward_head_dims=(64,)), "test")
    case = Case(2, 4, 2, 33, 47, 32, "float16", M.NONE)
    assert cand.supports(case) is None
    res = check_backward_case(cand, case, device="cpu")
    assert res.status is Status.SKIPPED
    assert res.message == "its backward does not support head_dim 32 (declares backward head dims 64)"
    ok = Case(2, 4, 2, 33, 47, 64, "float16", M.NONE)
    assert check_backward_case(cand, ok, device="cpu").status is Status.PASSED


@pytest.mark.parametrize("kw,fragment", [
    ({"head_dims": (64,), "backward_head_dims": (128,)}, "among the forward's"),
    ({"backward_head_dims": ()}, "must be a non-empty list"),
    ({"backward_head_dims": 64}, "must be a non-empty list"),
    ({"backward_head_dims": (0,)}, "must be a non-empty list"),
])
def test_bad_python_backward_head_dims(kw, fragment):
    problems = _py(**kw).problems()
    assert len(problems) == 1 and fragment in problems[0], problems


def test_backward_head_dims_without_a_backward_is_refused():
    k = PythonKernel(name="fwd_only", fn=eager, device="cpu", backward_head_dims=(64,))
    assert k.problems() == ["backward_head_dims given without a backward"]


# --- head_dim_v pairs -----------------------------------------------------------------
def _pairs(value: str, dims: str = "[128, 192]") -> str:
    return HEAD.replace("head_dims = [64]", f"head_dims = {dims}\nhead_dim_v = {value}")


def test_a_variant_declares_the_dv_pairs_it_runs(tmp_path):
    spec = load_variant_dir(_variant(tmp_path, _pairs("[[192, 128]]")))
    assert spec.supports.head_dim_v and spec.supports.head_dim_v_pairs == ((192, 128),)
    s = spec.to_support()
    assert s.reason_unsupported(Case(1, 2, 2, 16, 16, 192, "float16", head_dim_v=128)) is None
    assert s.reason_unsupported(Case(1, 2, 2, 16, 16, 128, "float16", head_dim_v=192)) == (
        "d_qk/d_v 128/192 not supported (declares head_dim_v pairs 192/128)")
    assert s.reason_unsupported(Case(1, 2, 2, 16, 16, 192, "float16")) is None  # d_v = d_qk
    # `true`: any pair of the head dims, as before
    anyp = load_variant_dir(_variant(tmp_path / "a", _pairs("true"))).to_support()
    assert anyp.head_dim_v_pairs is None
    assert anyp.reason_unsupported(Case(1, 2, 2, 16, 16, 128, "float16", head_dim_v=192)) is None


@pytest.mark.parametrize("value,fragment", [
    ("[[192, 192]]", "supports.head_dim_v[0]: d_v = d_qk = 192: list only pairs that differ"),
    ("[[192, 96]]", "supports.head_dim_v[0]: 96 is not among supports.head_dims (128, 192)"),
    ("[[192, 128, 64]]", "supports.head_dim_v[0]: must be a [d_qk, d_v] pair"),
    ("[192]", "supports.head_dim_v[0]: must be a [d_qk, d_v] pair"),
    ('[["192", 128]]', "supports.head_dim_v[0][0]"),
    ("[[192, 128], [192, 128]]", "supports.head_dim_v[1]"),
    ("[]", "supports.head_dim_v: must not be empty"),
    ('"yes"', "supports.head_dim_v"),
])
def test_bad_dv_pairs_name_the_field(tmp_path, value, fragment):
    msg = _error(tmp_path, _pairs(value))
    assert fragment in msg and "\n" not in msg, msg


# --- fp8 at some head dims ------------------------------------------------------------
def _fp8(value: str) -> str:
    return HEAD.replace("head_dims = [64]", f"head_dims = [64, 128]\nfp8 = {value}")


def test_a_variant_declares_the_head_dims_of_its_fp8_inputs(tmp_path):
    s = load_variant_dir(_variant(tmp_path, _fp8("[128]"))).to_support()
    assert s.fp8 and s.fp8_head_dims == frozenset({128})
    assert s.reason_unsupported(Case.from_id("b2h4k2-13x21-d128-fp16-none-fp8_qkv_head")) is None
    assert s.reason_unsupported(Case.from_id("b2h4k2-13x21-d64-fp16-none-fp8_qkv_head")) == (
        "fp8 q/k/v not supported at head_dim 64 (declares fp8 at 128)")
    assert s.reason_unsupported(Case.from_id("b2h4k2-13x21-d64-fp16-none")) is None
    every = load_variant_dir(_variant(tmp_path / "t", _fp8("true"))).to_support()
    assert every.fp8_head_dims is None
    assert every.reason_unsupported(Case.from_id("b2h4k2-13x21-d64-fp16-none-fp8_qkv_head")) is None


@pytest.mark.parametrize("value,fragment", [
    ("[256]", "supports.fp8[0]: 256 is not among supports.head_dims (64, 128)"),
    ("[]", "supports.fp8: must not be empty"),
    ('["128"]', "supports.fp8[0]"),
    ('"yes"', "supports.fp8"),
])
def test_bad_fp8_head_dims_name_the_field(tmp_path, value, fragment):
    msg = _error(tmp_path, _fp8(value))
    assert fragment in msg and "\n" not in msg, msg
