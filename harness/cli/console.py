"""The console every command prints tables to, and the one way user text reaches it.

On a terminal, the terminal's width (rich reads it, and `COLUMNS` when set). In a pipe (a
CI log) there is no width to read: `COLUMNS` when set, else 100 columns, wide enough for
the summary tables without forcing log viewers to scroll. Tables keep candidate names
whole (`no_wrap`) and fold the long case ids instead.

Text a command did not write itself (submission, token, variant and file names, messages
and paths from records, submitters, database rows) goes through `plain` before `print` and
through `markup` before rich: a control character is shown as its escape (`\\x1b`), never
sent to the terminal, where it would move the cursor, clear the screen or retitle the
window; a `[` is shown as itself, never read as rich markup (a name `[/]` would otherwise
stop a whole table with a MarkupError).
"""

from __future__ import annotations

import os
import re
import sys

PIPE_WIDTH = 100

# C0 controls and DEL, C1 controls (0x9b alone starts an escape sequence on many
# terminals), and the Unicode format characters that reorder or hide text (bidi overrides
# and isolates, zero-width joiners, the BOM) so that what is shown is what is stored.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
_UNSAFE_KEEP_LINES = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def _escape_char(m: re.Match[str]) -> str:
    c = m.group(0)
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def plain(text: object, *, lines: bool = False) -> str:
    """`text` safe to write to a terminal: every control or format character written as
    its escape. With `lines`, newlines and tabs are kept (a multi-line message)."""
    return (_UNSAFE_KEEP_LINES if lines else _UNSAFE).sub(_escape_char, str(text))


def markup(text: object, *, lines: bool = False) -> str:
    """`text` safe inside a rich markup string or a table cell: `plain`, then rich's own
    escaping of `[`."""
    from rich.markup import escape

    return escape(plain(text, lines=lines))


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
