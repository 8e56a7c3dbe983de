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
    mods = {m: _bool(ctx, table.get(m, False), f"supports.{m}") for m in SCORE_MODS + FP8_AXES}
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
        **mods,
    )


def _backward_masks(ctx: _Ctx, raw: Any, supports: SupportSpec) -> tuple[MaskKind, ...]:
    """`[backward] masks`: the mask kinds the backward runs, among `supports.masks` (its
    cases are the forward's first)."""
    masks = _enum_list(ctx, raw, "backward.masks", MaskKind, "mask kind")
    for i, m in enumerate(masks):
        if m not in supports.masks:
            raise ctx.fail(f"backward.masks[{i}]", f"{m.value!r} is not among supports.masks "
                           f"({', '.join(x.value for x in supports.masks)})")
    return tuple(masks)
