"""The manifest size-expression parser: what it computes and everything it rejects."""

from __future__ import annotations

import pytest

from harness.candidates.expr import ExprError, parse_expr

ENV = {"batch": 2, "heads": 8, "kv_heads": 2, "group": 4, "seqlen_q": 113, "seqlen_k": 203,
       "head_dim": 64, "dtype_bytes": 2, "num_splits": 3, "sm_count": 132, "block_q": 64}


@pytest.mark.parametrize("text, value", [
    ("7", 7),
    (7, 7),
    ("batch * heads", 16),
    ("ceil_div(seqlen_q, block_q)", 2),
    ("ceil_div(128, 64)", 2),
    ("seqlen_k / 2", 101),          # "/" is integer division: sizes are integers
    ("seqlen_k // 2", 101),
    ("seqlen_k % 10", 3),
    ("-head_dim + 100", 36),
    ("+head_dim", 64),
    ("min(seqlen_q, seqlen_k)", 113),
    ("max(1, 2, num_splits)", 3),
    ("min(num_splits - 1, 1)", 1),
    ("(block_q + 2 * 64) * head_dim * 4", 49152),
    ("num_splits * batch * heads * seqlen_q * head_dim", 3 * 2 * 8 * 113 * 64),
])
def test_valid_expressions(text, value):
    assert parse_expr(text).evaluate(ENV) == value


def test_names_are_collected():
    e = parse_expr("ceil_div(seqlen_q, block_q) * heads")
    assert e.names == {"seqlen_q", "block_q", "heads"}


@pytest.mark.parametrize("text, fragment", [
    ("", "empty"),
    ("   ", "empty"),
    ("batch +", "syntax error"),
    ("1.5", "integer literals"),
    ("'abc'", "integer literals"),
    ("True", "integer literals"),
    ("batch ** 2", "Pow"),
    ("batch << 2", "LShift"),
    ("batch & 1", "BitAnd"),
    ("not batch", "Not"),
    ("~batch", "Invert"),
    ("batch in (2, 3)", "operator In"),
    ("batch if heads else 1", "IfExp"),
    ("batch.real", "Attribute"),
    ("heads[0]", "Subscript"),
    ("[1, 2]", "List"),
    ("lambda: 1", "Lambda"),
    ("__import__('os')", "not allowed"),
    ("eval('1')", "not allowed"),
    ("ceil_div(1)", "takes 2 arguments"),
    ("ceil_div(1, 2, 3)", "takes 2 arguments"),
    ("min(1)", "at least 2"),
    ("max(*heads)", "*args"),
    ("min(a=1, b=2)", "keyword"),
    ("ceil_div", "is a function"),
    ("x" * 500, "longer than"),
    ("(lambda: 1)()", "not allowed"),
    (2.5, "expected an integer expression"),
    (True, "expected an integer expression"),
    ([1], "expected an integer expression"),
])
def test_rejections(text, fragment):
    with pytest.raises(ExprError, match=None) as info:
        parse_expr(text)
    assert fragment in str(info.value)


def test_unknown_name_names_it():
    with pytest.raises(ExprError) as info:
        parse_expr("seq_len * 2", {"seqlen_q", "seqlen_k"})
    assert "'seq_len'" in str(info.value)


def test_evaluation_errors():
    with pytest.raises(ExprError, match="division by zero"):
        parse_expr("batch / (heads - 8)").evaluate(ENV)
    with pytest.raises(ExprError, match="ceil_div by zero"):
        parse_expr("ceil_div(batch, 0)").evaluate(ENV)
    with pytest.raises(ExprError, match="no value for"):
        parse_expr("unknown_size").evaluate(ENV)
    with pytest.raises(ExprError, match="overflows"):
        parse_expr("9223372036854775807 * 2").evaluate({})
