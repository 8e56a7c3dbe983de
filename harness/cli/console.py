"""The console every command prints tables to.

On a terminal, the terminal's width (rich reads it, and `COLUMNS` when set). In a pipe (a
CI log) there is no width to read: `COLUMNS` when set, else 100 columns, wide enough for
the summary tables without forcing log viewers to scroll. Tables keep candidate names
whole (`no_wrap`) and fold the long case ids instead.
"""

from __future__ import annotations

import os
import sys

PIPE_WIDTH = 100


def width() -> int | None:
    """Columns for output that is not a terminal; None lets rich ask the terminal."""
    if sys.stdout.isatty():
        return None
    try:
        cols = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        cols = 0
    return cols if cols >= 40 else PIPE_WIDTH


def console():
    from rich.console import Console

    # soft_wrap: a message line is never broken (a CI log wraps it); tables keep the width
    return Console(highlight=False, width=width(), soft_wrap=True)
