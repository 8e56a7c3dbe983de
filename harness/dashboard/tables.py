"""Tables whose links open in the same tab.

Streamlit draws a LinkColumn cell as a link with target=_blank: every click on a run, a
Compare or a History in a table opened a new tab. Here a table's link columns hold the
same hrefs (`ui.run_href`, `ui.compare_href`, `ui.history_href`), shown as short text
("run 42", "17 vs 42", "history") in the first columns, in view without scrolling
sideways; the table is selectable cell by cell, and selecting a link cell moves this tab
to the page the href names (st.switch_page with its query parameters, as st.page_link
does), so the page opened has the deep link's URL. Links out of the dashboard (a commit
on GitHub) stay LinkColumns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pandas as pd
import streamlit as st

from harness.dashboard import ui

# How a link cell reads, by the page it opens (from the href's query parameters).
LABELS: dict[str, Callable[[dict[str, str]], str]] = {
    "run": lambda q: f"run {q.get('run', '?')}",
    "compare": lambda q: f"{q.get('base', '?')} vs {q.get('new', '?')}",
    "history": lambda q: "history",
}
HELP = "Click a cell to open it in this tab"
CAPTION = "Click a {names} cell to open it here."


def target(href: object) -> tuple[str, dict[str, str]] | None:
    """`./?page=run&run=42` -> ("run", {"run": "42"}); None for an empty cell."""
    if not isinstance(href, str) or not href:
        return None
    query = dict(parse_qsl(urlsplit(href).query))
    page = query.pop("page", None)
    return (page, query) if page else None


def label(href: object) -> str | None:
    found = target(href)
    if found is None:
        return None
    page, query = found
    fmt = LABELS.get(page)
    return fmt(query) if fmt else page


def _fallback(frame: pd.DataFrame, links: Sequence[str],
              config: dict[str, Any], **kwargs: Any) -> None:
    # A page rendered outside app.py (no pages to switch to): plain link columns.
    known = {"run": ui.RUN_LINK, "compare": ui.COMPARE_LINK, "history": ui.HISTORY_LINK}
    for col in links:
        config[col] = known.get(col) or st.column_config.LinkColumn(col)
    st.dataframe(frame, column_config=config, **kwargs)


def show(ctx: Any, frame: pd.DataFrame, *, key: str, links: Sequence[str],
         column_config: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """`frame` as a table whose `links` columns (hrefs into the dashboard) open their page
    in this tab when a cell is selected. `key` names the table's selection state, unique
    on its page."""
    config = dict(column_config or {})
    links = [c for c in links if c in frame.columns]
    pages = getattr(ctx, "pages", None) or {}
    if not pages:
        _fallback(frame, links, config, **kwargs)
        return
    shown = frame.copy()
    for col in links:
        shown[col] = shown[col].map(label)
        # Not pinned: a pinned column is drawn greyed, like an index, not like a link.
        config[col] = st.column_config.TextColumn(col, help=HELP)
    order = [*links, *(c for c in frame.columns if c not in links)]
    event = st.dataframe(shown, key=key, on_select="rerun", selection_mode="single-cell",
                         column_config=config, column_order=order, **kwargs)
    for row, col in event.selection.cells:
        found = target(frame[col].iloc[row]) if col in links else None
        if found is not None and found[0] in pages:
            st.switch_page(pages[found[0]], query_params=found[1])
    if links:
        st.caption(CAPTION.format(names=" / ".join(links)))
