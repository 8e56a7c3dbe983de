"""Small page helpers: query-parameter-backed pickers, links, formatting."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pandas as pd
import streamlit as st

T = TypeVar("T")

# Query parameters every view understands; a link built from them reopens the same view.
PARAMS = ("page", "run", "variant", "case", "gpu", "base", "new", "branch", "metric")


def param(name: str) -> str | None:
    value = st.query_params.get(name)
    return value.strip() if isinstance(value, str) and value.strip() else None


def set_params(**values: Any) -> None:
    """Write the current selection into the URL, so the view can be shared as a link."""
    for key, value in values.items():
        if value is None or value == "":
            st.query_params.pop(key, None)
        elif st.query_params.get(key) != str(value):
            st.query_params[key] = str(value)


def pick(label: str, options: Sequence[T], name: str, *, default: T | None = None,
         fmt: Callable[[T], str] = str, key_of: Callable[[T], str] = str,
         where: Any = st) -> T | None:
    """A selectbox whose initial choice comes from query parameter `name` (falling back to
    `default`, then the first option), and whose choice is written back to the URL.
    A parameter naming no option is reported, never silently replaced."""
    if not options:
        return None
    wanted = param(name)
    keys = [key_of(o) for o in options]
    index = 0
    if wanted is not None and wanted in keys:
        index = keys.index(wanted)
    elif wanted is not None:
        where.warning(f"`{name}={wanted}` from the link is not in this database; "
                      f"showing {fmt(options[0]) if default is None else fmt(default)} instead.")
        if default is not None and key_of(default) in keys:
            index = keys.index(key_of(default))
    elif default is not None and key_of(default) in keys:
        index = keys.index(key_of(default))
    choice = where.selectbox(label, options, index=index, format_func=fmt)
    set_params(**{name: key_of(choice)})
    return choice


def short(commit: str | None) -> str:
    return (commit or "?")[:10]


def run_href(run_id: int) -> str:
    # "./" resolves to the app's root from any page path, where `page` picks the view.
    return f"./?page=run&run={int(run_id)}"


RUN_LINK = st.column_config.LinkColumn("run", display_text=r"run=(\d+)")


def run_label(row: pd.Series | dict[str, Any]) -> str:
    when = row["created_at"]
    when_s = when.strftime("%Y-%m-%d %H:%M") if hasattr(when, "strftime") else str(when)
    return (f"#{row['id']} {short(row['commit'])} {row.get('branch') or ''} "
            f"{row.get('gpu_model_key') or ''} {when_s}").replace("  ", " ")


def empty(message: str) -> None:
    st.info(message)


def fmt_bytes(n: float | None) -> str:
    if n is None or pd.isna(n):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"
