"""Help text that fits the terminal it is printed to.

A command's description is its module docstring, written at the source's 92 columns with
lists (exit codes, stages) laid out by hand. argparse either keeps those lines as they are
(`RawDescriptionHelpFormatter`: 81-90 column lines folded by an 80-column CI log) or
refills everything into one paragraph (the default: the lists lost). `DocstringFormatter`
refills each paragraph and each list item to the width argparse gives it (the terminal's,
or $COLUMNS), keeping the item's marker and hanging indent; lines indented as a block
(commands shown as examples) stay as they are.
"""

from __future__ import annotations

import argparse
import re
import textwrap

# A list item: its indent, its marker (an exit code, a dash or a star) and the spaces
# before its text.
_ITEM = re.compile(r"^(\s*)(\d+|-|\*)(\s+)\S")
_VERBATIM_INDENT = 4  # a line indented this far that no item continues is shown as is


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def refill(text: str, width: int) -> str:
    """`text` with each paragraph and list item refilled to `width` (module doc)."""
    out: list[str] = []
    block: list[str] = []  # the lines of the paragraph or item being gathered
    head = ""  # the gathered block's first-line prefix (indent and marker)
    hang = ""  # its continuation lines' indent

    def flush() -> None:
        nonlocal block
        if block:
            words = " ".join(s.strip() for s in block)
            out.extend(textwrap.wrap(words, width=max(width, 20), initial_indent=head,
                                     subsequent_indent=hang, break_long_words=False,
                                     break_on_hyphens=False) or [head.rstrip()])
        block = []

    for line in text.splitlines():
        if not line.strip():
            flush()
            out.append("")
            continue
        item = _ITEM.match(line)
        if item:
            flush()
            head = line[:item.end() - 1]
            hang = " " * len(head)
            block = [line[len(head):]]
        elif block and _indent(line) >= len(hang) and (hang or _indent(line) == 0):
            block.append(line)  # the gathered paragraph or item goes on
        elif _indent(line) >= _VERBATIM_INDENT:
            flush()
            out.append(line)
        else:
            flush()
            head = hang = " " * _indent(line)
            block = [line]
    flush()
    return "\n".join(out)


class DocstringFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs refilled to the help's width (module doc)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.indent(refill(text, width - len(indent)), indent)
