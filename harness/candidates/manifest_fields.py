"""The typed field readers of manifest validation: each returns the value or raises one
`VariantError` naming the file, the field and what is wrong (harness.candidates.manifest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.candidates.variant_spec import LoadError, VariantError


class _Ctx:
    def __init__(self, path: Path, variant: str):
        self.path = path
        self.variant = variant
        self.expr_nodes = 0  # of every size expression read so far (manifest's bound)

    def fail(self, where: str, message: str) -> VariantError:
        return VariantError(LoadError(str(self.path), where, message, self.variant))


def _keys(ctx: _Ctx, table: Any, where: str, required: tuple[str, ...],
          optional: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ctx.fail(where, f"must be a table, got {_tname(table)}")
    for k in table:
        if k not in required and k not in optional:
            prefix = f"{where}." if where else ""
            raise ctx.fail(f"{prefix}{k}", f"unknown field (allowed here: "
                           f"{', '.join(required + optional)})")
    for k in required:
        if k not in table:
            prefix = f"{where}." if where else ""
            raise ctx.fail(f"{prefix}{k}", "missing required field")
    return table


def _tname(v: Any) -> str:
    return {str: "a string", int: "an integer", bool: "a boolean", float: "a float",
            list: "a list", dict: "a table"}.get(type(v), type(v).__name__)


def _str(ctx: _Ctx, v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise ctx.fail(where, f"must be a string, got {_tname(v)}")
    return v


def _bool(ctx: _Ctx, v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise ctx.fail(where, f"must be true or false, got {_tname(v)}")
    return v


def _int(ctx: _Ctx, v: Any, where: str, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ctx.fail(where, f"must be an integer, got {_tname(v)}")
    if v < minimum:
        raise ctx.fail(where, f"must be >= {minimum}, got {v}")
    return v


def _list(ctx: _Ctx, v: Any, where: str, nonempty: bool = True) -> list[Any]:
    if not isinstance(v, list):
        raise ctx.fail(where, f"must be a list, got {_tname(v)}")
    if nonempty and not v:
        raise ctx.fail(where, "must not be empty")
    return v


def _bounded(ctx: _Ctx, v: Any, where: str, most: int, *, nonempty: bool = True,
             unique: bool = False) -> list[Any]:
    """A list of at most `most` items (without repeats when `unique`)."""
    items = _list(ctx, v, where, nonempty=nonempty)
    if len(items) > most:
        raise ctx.fail(where, f"at most {most} entries, got {len(items)}")
    if unique:
        seen: list[Any] = []
        for i, x in enumerate(items):
            if x in seen:
                raise ctx.fail(f"{where}[{i}]", f"{x!r} is listed twice")
            seen.append(x)
    return items
