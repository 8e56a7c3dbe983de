"""The Streamlit side of data access: cached engines and cached query results.

Engines are cached per URL for the life of the server (`st.cache_resource`); query results
per (URL, query, arguments) for TTL_S seconds (`st.cache_data`), so a history of a million
rows costs one indexed query per view per minute, whatever the number of viewers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import streamlit as st
from sqlalchemy import Engine

from harness.dashboard import alerts, board_data, case_kinds, compare_data, queries, source

TTL_S = 60


@st.cache_resource(show_spinner=False)
def engine_for(url: str) -> Engine:
    return source.make_engine(url)


@st.cache_data(ttl=10, show_spinner=False)
def probe(url: str) -> source.Probe:
    # A throwaway engine: a missing SQLite file is reported before anything connects to it
    # (connecting would create it), and a failed probe leaves no broken engine cached.
    return source.probe(url)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def load(url: str, name: str, *args: Any) -> Any:
    fn: Callable[..., Any] = next(getattr(m, name) for m in (queries, alerts, compare_data,
                                                             board_data, case_kinds)
                                  if hasattr(m, name))
    return fn(engine_for(url), *args)


@dataclass(frozen=True)
class Ctx:
    """What every page gets: the database URL, the cached query entry point, and the
    app's pages by key (for links that open in the same tab: st.page_link)."""

    url: str
    pages: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def q(self, name: str, *args: Any) -> Any:
        return load(self.url, name, *args)
