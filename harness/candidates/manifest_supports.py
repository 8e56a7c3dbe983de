"""Manifest validation of `[supports]` (what a variant runs) and of the mask list a
`[backward]` may narrow it to: harness.candidates.manifest's readers, kept apart so that
each module stays readable."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, TypeVar

from harness.candidates.manifest_fields import _bool, _bounded, _Ctx, _int, _keys, _str, _tname
from harness.candidates.variant_spec import (
    FP8_AXES,
    MAX_HEAD_DIM,
    SCORE_MODS,
    SUPPORTS_OPTIONAL,
    SUPPORTS_REQUIRED,
    SupportSpec,
)
from harness.core.cases import DTYPES, Layout, MaskKind

E = TypeVar("E", bound=StrEnum)


def _enum_list(ctx: _Ctx, raw: Any, where: str, enum: type[E], what: str) -> list[E]:
    """A list of strings, each a value of `enum`; one message naming the bad entry."""
    out: list[E] = []
    for i, item in enumerate(_bounded(ctx, raw, where, len(enum), unique=True)):
        s = _str(ctx, item, f"{where}[{i}]")
        try:
            out.append(enum(s))
        except ValueError:
            raise ctx.fail(f"{where}[{i}]", f"unknown {what} {s!r} (one of "
                           f"{', '.join(x.value for x in enum)})") from None
    return out


def _supports(ctx: _Ctx, table: Any) -> SupportSpec:
    _keys(ctx, table, "supports", SUPPORTS_REQUIRED, SUPPORTS_OPTIONAL)
    dtypes = tuple(_str(ctx, d, f"supports.dtypes[{i}]") for i, d in
                   enumerate(_bounded(ctx, table["dtypes"], "supports.dtypes", len(DTYPES),
                                      unique=True)))
    for i, d in enumerate(dtypes):
        if d not in DTYPES:
            raise ctx.fail(f"supports.dtypes[{i}]", f"unknown dtype {d!r} "
                           f"(one of {', '.join(DTYPES)})")
    raw_dims = table["head_dims"]
    max_head_dim = MAX_HEAD_DIM
    if "max_head_dim" in table:
        max_head_dim = _int(ctx, table["max_head_dim"], "supports.max_head_dim", 1)
        if max_head_dim > MAX_HEAD_DIM:
            raise ctx.fail("supports.max_head_dim", f"must be <= {MAX_HEAD_DIM}")
    head_dims: tuple[int, ...] | None
    if raw_dims == "any":
        if "max_head_dim" not in table:
            raise ctx.fail("supports.max_head_dim", "required when head_dims = \"any\"")
        head_dims = None
    elif isinstance(raw_dims, list):
        head_dims = tuple(_int(ctx, d, f"supports.head_dims[{i}]", 1)
                          for i, d in enumerate(_bounded(ctx, raw_dims, "supports.head_dims",
                                                         MAX_HEAD_DIM, unique=True)))
        for i, d in enumerate(head_dims):
            if d > max_head_dim:
                raise ctx.fail(f"supports.head_dims[{i}]", f"{d} > {max_head_dim}")
    else:
        raise ctx.fail("supports.head_dims", f"must be a list of integers or \"any\", got "
                       f"{_tname(raw_dims)}")
    masks = _enum_list(ctx, table["masks"], "supports.masks", MaskKind, "mask kind")
    masked_lse = _str(ctx, table.get("masked_lse", "-inf"), "supports.masked_lse")
    if masked_lse not in ("-inf", "+inf"):
        raise ctx.fail("supports.masked_lse", f"must be \"-inf\" or \"+inf\", got {masked_lse!r}")
    mq = table.get("max_seqlen_q")
    mk_ = table.get("max_seqlen_k")
    layouts = _enum_list(ctx, table.get("layouts", ["dense"]), "supports.layouts", Layout,
                         "layout")
    flags = tuple(m for m in SCORE_MODS + FP8_AXES if m not in ("head_dim_v", "fp8"))
    mods = {m: _bool(ctx, table.get(m, False), f"supports.{m}") for m in flags}
    mods["head_dim_v"], pairs = _head_dim_v(ctx, table.get("head_dim_v", False), head_dims)
    mods["fp8"], fp8_dims = _fp8(ctx, table.get("fp8", False), head_dims)
    return SupportSpec(
        dtypes=dtypes, head_dims=head_dims, max_head_dim=max_head_dim, masks=tuple(masks),
        gqa=_bool(ctx, table["gqa"], "supports.gqa"),
        writes_lse=_bool(ctx, table["writes_lse"], "supports.writes_lse"),
        masked_lse=masked_lse,
        max_seqlen_q=None if mq is None else _int(ctx, mq, "supports.max_seqlen_q", 1),
        max_seqlen_k=None if mk_ is None else _int(ctx, mk_, "supports.max_seqlen_k", 1),
        decode_only=_bool(ctx, table.get("decode_only", False), "supports.decode_only"),
        layouts=tuple(layouts),
        window=_bool(ctx, table.get("window", False), "supports.window"),
        head_dim_v_pairs=pairs,
        fp8_head_dims=fp8_dims,
        **mods,
    )


def _fp8(ctx: _Ctx, raw: Any, head_dims: tuple[int, ...] | None
         ) -> tuple[bool, tuple[int, ...] | None]:
    """`fp8`: true (e4m3 Q, K, V at every head dim), false, or the head dims it runs them
    at, e.g. [128], among `head_dims`."""
    if not isinstance(raw, list):
        return _bool(ctx, raw, "supports.fp8"), None
    dims = tuple(_int(ctx, d, f"supports.fp8[{i}]", 1)
                 for i, d in enumerate(_bounded(ctx, raw, "supports.fp8", 64, unique=True)))
    for i, d in enumerate(dims):
        if head_dims is not None and d not in head_dims:
            raise ctx.fail(f"supports.fp8[{i}]", f"{d} is not among supports.head_dims "
                           f"({', '.join(map(str, head_dims))})")
    return True, dims


def _head_dim_v(ctx: _Ctx, raw: Any, head_dims: tuple[int, ...] | None
                ) -> tuple[bool, tuple[tuple[int, int], ...] | None]:
    """`head_dim_v`: true (any d_v among the head dims), false, or the (d_qk, d_v) pairs
    with d_v != d_qk the variant has entries for, e.g. [[192, 128]]: a kernel is built
    for a few pairs, not for every combination of its head dims."""
    if not isinstance(raw, list):
        return _bool(ctx, raw, "supports.head_dim_v"), None
    pairs: list[tuple[int, int]] = []
    for i, item in enumerate(_bounded(ctx, raw, "supports.head_dim_v", 16, unique=True)):
        where = f"supports.head_dim_v[{i}]"
        if not isinstance(item, list) or len(item) != 2:
            raise ctx.fail(where, f"must be a [d_qk, d_v] pair of integers, got {_tname(item)}")
        dqk, dv = (_int(ctx, x, f"{where}[{j}]", 1) for j, x in enumerate(item))
        if dqk == dv:
            raise ctx.fail(where, f"d_v = d_qk = {dqk}: list only pairs that differ")
        for d in (dqk, dv):
            if head_dims is not None and d not in head_dims:
                raise ctx.fail(where, f"{d} is not among supports.head_dims "
                               f"({', '.join(map(str, head_dims))})")
        pairs.append((dqk, dv))
    return True, tuple(pairs)


def _backward_head_dims(ctx: _Ctx, raw: Any, supports: SupportSpec) -> tuple[int, ...]:
    """`[backward] head_dims`: the head dims the backward runs, among `supports.head_dims`
    (a forward often gains a head dim before its backward does); its entries exist for
    these only."""
    if supports.head_dims is None:
        raise ctx.fail("backward.head_dims", "needs supports.head_dims as a list (it is \"any\")")
    dims = tuple(_int(ctx, d, f"backward.head_dims[{i}]", 1)
                 for i, d in enumerate(_bounded(ctx, raw, "backward.head_dims",
                                                len(supports.head_dims), unique=True)))
    for i, d in enumerate(dims):
        if d not in supports.head_dims:
            raise ctx.fail(f"backward.head_dims[{i}]", f"{d} is not among supports.head_dims "
                           f"({', '.join(map(str, supports.head_dims))})")
    return dims


def _backward_masks(ctx: _Ctx, raw: Any, supports: SupportSpec) -> tuple[MaskKind, ...]:
    """`[backward] masks`: the mask kinds the backward runs, among `supports.masks` (its
    cases are the forward's first)."""
    masks = _enum_list(ctx, raw, "backward.masks", MaskKind, "mask kind")
    for i, m in enumerate(masks):
        if m not in supports.masks:
            raise ctx.fail(f"backward.masks[{i}]", f"{m.value!r} is not among supports.masks "
                           f"({', '.join(x.value for x in supports.masks)})")
    return tuple(masks)
