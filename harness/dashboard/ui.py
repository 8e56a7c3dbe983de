"""Small page helpers: query-parameter-backed pickers, links, formatting."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlencode

import pandas as pd
import streamlit as st

T = TypeVar("T")

# Query parameters every view understands; a link built from them reopens the same view.
PARAMS = ("page", "run", "variant", "case", "gpu", "base", "new", "branch", "metric",
          "base_gpu", "layout", "window")


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


def pick_gpu(names: dict[str, str], label: str = "GPU", name: str = "gpu", *,
             default: str | None = None, where: Any = st) -> str | None:
    """A GPU picker over model keys (`nvidia-h200`), shown by the name the GPU reports.
    A link may name the GPU either way: `gpu=NVIDIA%20H200` opens `nvidia-h200`."""
    keys = list(names)  # in the order given: the model with the most runs first
    wanted = param(name)
    if wanted is not None and wanted not in keys:
        alias = {v.strip().lower(): k for k, v in names.items()}
        alias.update({gpu_key(v): k for k, v in names.items()})
        match = alias.get(wanted.lower()) or alias.get(gpu_key(wanted))
        if match is not None:
            st.query_params[name] = match
    return pick(label, keys, name, default=default, fmt=lambda k: names.get(k) or k,
                where=where)


def gpu_key(name: str) -> str:
    """The model-key spelling of a GPU name (`NVIDIA H200` -> `nvidia-h200`), as the
    records store it (`harness.records.record.gpu_model_key`)."""
    return re.sub(r"[^a-z0-9]+", "-", name.strip().lower()).strip("-")


def grid_name(grids: object) -> str:
    """A run's grids as one name: `["smoke", "perf"]` -> `smoke+perf`."""
    if isinstance(grids, (list, tuple)):
        return "+".join(str(g) for g in grids) or "-"
    return str(grids) if grids else "-"


def short(commit: str | None) -> str:
    return (commit or "?")[:10]


def run_href(run_id: int) -> str:
    # "./" resolves to the app's root from any page path, where `page` picks the view.
    return f"./?page=run&run={int(run_id)}"


def compare_href(base_id: int, new_id: int) -> str:
    return f"./?page=compare&base={int(base_id)}&new={int(new_id)}"


def history_href(variant: str, case_id: str, gpu: str | None) -> str:
    query = {"page": "history", "variant": variant, "case": case_id}
    if gpu:
        query["gpu"] = gpu
    return "./?" + urlencode(query)


def page_link(ctx: Any, key: str, label: str, *, where: Any = st, **params: Any) -> None:
    """A link to page `key` with `params` that opens in the same tab (st.page_link; a
    table's link column opens a new one), or a plain link where the app's pages are
    unknown (a page rendered outside app.py)."""
    query = {k: str(v) for k, v in params.items() if v is not None}
    page = getattr(ctx, "pages", {}).get(key)
    if page is not None:
        where.page_link(page, label=label, query_params=query)
    else:
        where.markdown(f"[{label}](./?{urlencode({'page': key} | query)})")


RUN_LINK = st.column_config.LinkColumn("run", display_text=r"run=(\d+)")
COMPARE_LINK = st.column_config.LinkColumn("compare", display_text="base vs new")
HISTORY_LINK = st.column_config.LinkColumn("history", display_text="history")
COMMIT_LINK = st.column_config.LinkColumn(display_text=r"/commit/([0-9a-f]{10})")


def fmt_num(x: float | None, spec: str = ",.0f") -> str:
    """A number for a caption (`4,251`), `-` when missing."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


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


# Every character that starts inline Markdown or one of Streamlit's directives
# (":red[...]", ":material/...:", emoji shortcodes, "$...$" LaTeX).
_MD_SPECIAL = re.compile(r"([\\`*_\[\]()!<>#|~&$:{}+.-])")


def md_escape(text: Any) -> str:
    """`text` shown literally where Streamlit renders Markdown (st.table's cells, labels):
    a compiler's `__global__` must not turn bold, and a submitter's text must not become
    a link or a directive."""
    if text is None:
        return ""
    return _MD_SPECIAL.sub(r"\\\1", str(text)).replace("\n", " ")
