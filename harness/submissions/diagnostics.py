"""Compiler messages that may be shown to anyone: only lines about the submission's own
files, cut to a few lines of bounded length.

A compiler quotes whatever it read (an included file's text, a macro's expansion, a path
of the machine it runs on). What reaches `submissions.message`, the leaderboard or the
Submit page is built from the diagnostic lines that name one of the submission's files (or
the harness's public header) as `file(line): ...` (cudafe/cicc) or `file:line[:col]: ...`
(the host preprocessor), with the location rewritten to the bare file name; quoted source
lines, carets, "In file included from" chains and every other line are dropped. The few
ptxas messages that matter for a submission (an unresolved extern, a resource limit) are
rebuilt from their identifiers, never copied.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_LINES = 5
MAX_LINE_CHARS = 240
HEADER_NAME = "fa_harness.h"
ENTRY_CHECKS = "<entry point checks>"  # the harness's own lines after the sources

_LOC = re.compile(r"^(?:/src/)?(?P<file><entry point checks>|[A-Za-z0-9_][A-Za-z0-9_./\-]*)"
                  r"(?:\((?P<l1>\d+)\)|:(?P<l2>\d+)(?::\d+)?):\s*(?P<msg>.*)$")
_KIND = re.compile(r"^(catastrophic error|fatal error|error|warning)\b", re.I)
_UNRESOLVED = re.compile(r"[Uu]nresolved extern function '([A-Za-z_]\w{0,127})'")
_PTXAS_LIMIT = re.compile(r"[Ee]ntry function '([A-Za-z_]\w{0,127})' uses too much "
                          r"(shared|local) data")


def filter_output(output: str, names: Iterable[str], *, errors_only: bool = True,
                  max_lines: int = MAX_LINES) -> list[str]:
    """The diagnostic lines of `output` about `names` (and the public header), at most
    `max_lines`, each at most MAX_LINE_CHARS characters."""
    allowed = set(names) | {HEADER_NAME, ENTRY_CHECKS}
    kept: list[str] = []
    for raw in output.splitlines():
        line = raw.strip()
        m = _LOC.match(line)
        if m and m.group("file") in allowed:
            msg = m.group("msg")
            if errors_only and not re.match(r"^(catastrophic error|fatal error|error)\b",
                                            msg, re.I):
                continue
            if not _KIND.match(msg):
                continue
            where = f"{m.group('file')}:{m.group('l1') or m.group('l2')}"
            kept.append(_cut(f"{where}: {msg}"))
        else:
            u = _UNRESOLVED.search(line)
            if u:
                kept.append(f"ptxas: unresolved extern function '{u.group(1)}' (device-side "
                            f"calls to functions outside the submission are not linked)")
            p = _PTXAS_LIMIT.search(line)
            if p:
                kept.append(f"ptxas: entry function '{p.group(1)}' uses too much "
                            f"{p.group(2)} data")
        if len(kept) >= max_lines:
            break
    out: list[str] = []
    for k in kept:
        if k not in out:
            out.append(k)
    return out


def compile_message(output: str, names: Iterable[str], *, what: str = "compile failed") -> str:
    """One message for a failed compile, from `filter_output` only."""
    lines = filter_output(output, names)
    if not lines:
        return (f"{what} (the compiler's messages name no file of the submission, so "
                f"they are not shown)")
    return f"{what}: " + "\n".join(lines)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS - 3] + "..."


# A path with at least one directory: everything up to its last "/" goes.
_DIRS = re.compile(r"(?<![\w.~-])(?:[A-Za-z]:)?/(?:[^\s/:()'\"<>,]+/)+")


def strip_paths(text: str) -> str:
    """`text` with the folders of every path dropped (`/home/x/harness/f.py:12` ->
    `f.py:12`): an exception's message or its innermost frame names the machine's files,
    and a scoring message is shown to the submitter."""
    return _DIRS.sub("", text)

