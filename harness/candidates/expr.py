"""Integer size expressions used in kernel manifests (grid, shared memory, workspace sizes).

A manifest says things like ``grid = ["ceil_div(seqlen_q, block_q)", "heads", "batch"]``.
Those strings are parsed with :mod:`ast` and only a whitelist of node types is accepted:
integer literals, known names, ``+ - * // / %`` (``/`` is integer division here: every size
is an integer), unary minus, parentheses, comparisons (``==``, ``!=``, ``<``, ``<=``, ``>``,
``>=``: 1 when true, else 0) and the calls ``ceil_div``, ``min``, ``max``.
Nothing is ever handed to ``eval``: a manifest is untrusted input (submissions use the
same format), so an attribute access, a subscript or an unknown call is a parse error.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Names the harness defines for every case (see `size_env`). Tile constants from the
# manifest's [tiles] table are added per variant. `causal` is 1 for a causal mask (either
# alignment: FA_MASK_CAUSAL in the kernel's mask_kind) and 0 otherwise, so that a manifest
# can size a tile by mask and pick a launch by it (a zero grid dimension skips a launch).
# `score_mods` is 1 when the case has a score modifier (softcap, ALiBi, sinks), else 0: a
# launch table of entries compiled with the modifiers' code, apart from those without.
# `fp8_qkv` is 1 when Q, K and V are float8 e4m3, `fp8_kv` when the K/V cache is (Q in
# the case dtype), each else 0 (docs/fp8.md): entries built for e4m3 tiles, picked the
# same way. `head_dim_v` is d_v, V's and O's head dim (= head_dim unless the case sets it).
SIZE_NAMES: frozenset[str] = frozenset({
    "batch", "heads", "kv_heads", "group", "seqlen_q", "seqlen_k", "head_dim",
    "dtype_bytes", "num_splits", "sm_count", "causal", "score_mods", "fp8_qkv", "fp8_kv",
    "head_dim_v",
})

# Comparisons, each 1 when it holds and 0 when not: a launch picked by head dim reads
# `(head_dim == 256)` rather than a product of floor divisions.
_COMPARE = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)

FUNCTIONS: dict[str, int] = {"ceil_div": 2, "min": -2, "max": -2}  # -2: two or more args

# Guard against absurd inputs (a 10 kB expression, a 1e300 literal): sizes fit in 63 bits.
# An expression is evaluated at every case of the scoring grids (hundreds), so its size
# bounds that work too: the manifest bounds how many there are (harness.candidates.manifest).
MAX_EXPR_CHARS = 400
MAX_EXPR_NODES = 128  # names, literals, operators and calls; the shipped kernels need < 60
MAX_VALUE = (1 << 63) - 1


class ExprError(ValueError):
    """An expression that cannot be parsed or evaluated; the message says why."""


@dataclass(frozen=True)
class Expr:
    """A parsed, validated size expression."""

    text: str
    tree: ast.expr = field(repr=False, compare=False)
    names: frozenset[str] = frozenset()
    nodes: int = field(default=1, compare=False)  # the work of one evaluation

    def evaluate(self, env: Mapping[str, int]) -> int:
        missing = sorted(n for n in self.names if n not in env)
        if missing:
            raise ExprError(f"no value for {', '.join(missing)} in {self.text!r}")
        return _eval(self.tree, env, self.text)


def parse_expr(text: str | int, allowed_names: Iterable[str] | None = None) -> Expr:
    """Parse `text` (or wrap an int) into an `Expr`.

    `allowed_names`: when given, any other name is rejected with a message naming it
    (the manifest loader passes the size names plus the variant's tiles)."""
    if isinstance(text, bool):
        raise ExprError(f"expected an integer expression, got {text!r}")
    if isinstance(text, int):
        text = str(text)
    if not isinstance(text, str):
        raise ExprError(f"expected an integer expression (string or int), got {type(text).__name__}")
    src = text.strip()
    if not src:
        raise ExprError("empty expression")
    if len(src) > MAX_EXPR_CHARS:
        raise ExprError(f"expression longer than {MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(src, mode="eval").body
    except SyntaxError as e:
        raise ExprError(f"syntax error in {src!r}: {e.msg}") from None
    names: set[str] = set()
    _check(tree, src, names)
    nodes = sum(1 for n in ast.walk(tree) if isinstance(n, ast.expr))
    if nodes > MAX_EXPR_NODES:
        raise ExprError(f"expression of {nodes} terms (at most {MAX_EXPR_NODES}) in {src!r}")
    if allowed_names is not None:
        allowed = set(allowed_names)
        unknown = sorted(names - allowed)
        if unknown:
            raise ExprError(
                f"unknown name {unknown[0]!r} in {src!r} (known: {', '.join(sorted(allowed))})"
            )
    return Expr(src, tree, frozenset(names), nodes)


def _check(node: ast.AST, src: str, names: set[str]) -> None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            raise ExprError(f"only integer literals are allowed, got {node.value!r} in {src!r}")
        if node.value > MAX_VALUE:
            raise ExprError(f"literal {node.value} too large in {src!r}")
    elif isinstance(node, ast.Name):
        if node.id in FUNCTIONS:
            raise ExprError(f"{node.id!r} is a function, call it: {node.id}(...) in {src!r}")
        names.add(node.id)
    elif isinstance(node, ast.BinOp):
        if not isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Div, ast.Mod)):
            raise ExprError(f"operator {type(node.op).__name__} not allowed in {src!r}")
        _check(node.left, src, names)
        _check(node.right, src, names)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.USub, ast.UAdd)):
            raise ExprError(f"operator {type(node.op).__name__} not allowed in {src!r}")
        _check(node.operand, src, names)
    elif isinstance(node, ast.Compare):
        for op in node.ops:
            if not isinstance(op, _COMPARE):
                raise ExprError(f"operator {type(op).__name__} not allowed in {src!r}")
        _check(node.left, src, names)
        for c in node.comparators:
            _check(c, src, names)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            what = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise ExprError(
                f"call to {what!r} not allowed in {src!r} (functions: ceil_div, min, max)"
            )
        if node.keywords:
            raise ExprError(f"keyword arguments not allowed in {src!r}")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise ExprError(f"*args not allowed in {src!r}")
        want = FUNCTIONS[node.func.id]
        n = len(node.args)
        if (want > 0 and n != want) or (want < 0 and n < -want):
            need = str(want) if want > 0 else f"at least {-want}"
            raise ExprError(f"{node.func.id} takes {need} arguments, got {n} in {src!r}")
        for a in node.args:
            _check(a, src, names)
    else:
        raise ExprError(f"{type(node).__name__} not allowed in size expression {src!r}")


def _eval(node: ast.expr, env: Mapping[str, int], src: str) -> int:
    if isinstance(node, ast.Constant):
        return int(node.value)
    if isinstance(node, ast.Name):
        return int(env[node.id])
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env, src)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a = _eval(node.left, env, src)
        b = _eval(node.right, env, src)
        op = node.op
        if isinstance(op, ast.Add):
            r = a + b
        elif isinstance(op, ast.Sub):
            r = a - b
        elif isinstance(op, ast.Mult):
            r = a * b
        else:
            if b == 0:
                raise ExprError(f"division by zero in {src!r}")
            r = a % b if isinstance(op, ast.Mod) else a // b
        if abs(r) > MAX_VALUE:
            raise ExprError(f"value overflows 63 bits in {src!r}")
        return r
    if isinstance(node, ast.Compare):
        # Chained as Python chains them: a < b <= c is a < b and b <= c.
        left = _eval(node.left, env, src)
        for op, c in zip(node.ops, node.comparators, strict=True):
            right = _eval(c, env, src)
            if not _holds(op, left, right):
                return 0
            left = right
        return 1
    if isinstance(node, ast.Call):
        args = [_eval(a, env, src) for a in node.args]
        fname = node.func.id  # type: ignore[attr-defined]
        if fname == "ceil_div":
            if args[1] == 0:
                raise ExprError(f"ceil_div by zero in {src!r}")
            return -(-args[0] // args[1])
        return min(args) if fname == "min" else max(args)
    raise ExprError(f"cannot evaluate {src!r}")  # unreachable after _check


def _holds(op: ast.cmpop, a: int, b: int) -> bool:
    if isinstance(op, ast.Eq):
        return a == b
    if isinstance(op, ast.NotEq):
        return a != b
    if isinstance(op, ast.Lt):
        return a < b
    if isinstance(op, ast.LtE):
        return a <= b
    if isinstance(op, ast.Gt):
        return a > b
    return a >= b


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
