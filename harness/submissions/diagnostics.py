"""Compiler messages that may be shown to anyone: only lines about the submission's own
files, cut to a few lines of bounded length.

A compiler quotes whatever it read (an included file's text, a macro's expansion from a
system header, a path of the machine it runs on). What reaches `submissions.message`, the
leaderboard or the Submit page is built from positions in the submission's files only:
the diagnostic lines that name one of its files (or the harness's public header) as
`file(line): ...` (cudafe/cicc) or `file:line[:col]: ...` (the host preprocessor), at a
line the file has, with the location rewritten to the bare file name. In the message
itself, text the compiler quoted (`"..."`, `'...'`, an `#error`'s words, the file an
`#include` could not open) is kept only where the submission's own files hold it; any
other is replaced by `...`, and what still looks like a path loses its folders. Quoted
source lines, carets, "In file included from" chains and every other line are dropped.
The few ptxas messages that matter for a submission (an unresolved extern, a resource
limit) are rebuilt from their identifiers, never copied.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

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
# What a compiler quotes: "x", 'x', and GCC's typographic quotes outside the C locale.
_QUOTED = re.compile("\"[^\"]*\"|'[^']*'|\u2018[^\u2019]*\u2019|\u201c[^\u201d]*\u201d")
# Unquoted text taken from the input: an #error's words (GCC; cicc adds "directive:"),
# the file an #include named (GCC: "fatal error: NAME: No such file or directory").
_ERROR_WORDS = re.compile(r"^((?:fatal )?error: #error(?: directive:)?)\s*(.*)$", re.I)
_NO_FILE = re.compile(r"^((?:fatal )?error: )(.+)(: [A-Z][A-Za-z ]+)$")


def filter_output(output: str, names: Iterable[str],
                  texts: Mapping[str, str] | None = None, *, public: Iterable[str] = (),
                  errors_only: bool = True, max_lines: int = MAX_LINES) -> list[str]:
    """The diagnostic lines of `output` about `names` (and the public header), at most
    `max_lines`, each at most MAX_LINE_CHARS characters. `texts` are the submission's
    files by name: a location past a file's last line is dropped, and quoted text is kept
    only where these files or the `public` texts (the harness's header and what its
    entry checks say) hold it (without either, none is)."""
    allowed = set(names) | {HEADER_NAME, ENTRY_CHECKS}
    texts = texts or {}
    corpus = "\n".join([*texts.values(), *public])
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
            file, number = m.group("file"), int(m.group("l1") or m.group("l2"))
            text = texts.get(file) or texts.get(file.rsplit("/", 1)[-1])
            if text is not None and not 1 <= number <= text.count("\n") + 1:
                continue  # not a line of the file: the position is not the submission's
            kept.append(_cut(f"{file}:{number}: {scrub(msg, corpus)}"))
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


def scrub(msg: str, corpus: str) -> str:
    """`msg` with every piece of quoted or echoed input that `corpus` (the submission's
    own text) does not hold replaced by `...`, and the folders of paths dropped."""
    def quoted(m: re.Match[str]) -> str:
        inner = m.group()[1:-1]
        return m.group() if not inner or inner in corpus else m.group()[0] + "..." + \
            m.group()[-1]

    e = _ERROR_WORDS.match(msg)
    if e:
        words = e.group(2).strip()
        return f"{e.group(1)} {words if words in corpus else '...'}"
    nf = _NO_FILE.match(msg)
    if nf and not _QUOTED.search(nf.group(2)):
        name = nf.group(2)
        return f"{nf.group(1)}{name if name in corpus else '...'}{nf.group(3)}"
    return strip_paths(_QUOTED.sub(quoted, msg))


def compile_message(output: str, names: Iterable[str], texts: Mapping[str, str] | None = None,
                    *, public: Iterable[str] = (), what: str = "compile failed") -> str:
    """One message for a failed compile, from `filter_output` only."""
    lines = filter_output(output, names, texts, public=public)
    if not lines:
        return (f"{what} (the compiler's messages name no file of the submission, so "
                f"they are not shown)")
    return f"{what}: " + "\n".join(lines)


def entry_check_texts(header: str, entries: Iterable[str]) -> list[str]:
    """What the header's FA_CHECK_ENTRY says of each entry when it fails, built the way
    the compiler builds it: the macro's string literals joined, `#name` the entry."""
    m = re.search(r"#define FA_CHECK_ENTRY\(name\)((?:[^\n]*\\\n)*[^\n]*)", header)
    if not m:
        return []
    body = m.group(1).replace("\\\n", " ")
    pieces = re.findall(r'"((?:[^"\\]|\\.)*)"|(#name)\b', body[body.find(","):])
    out = []
    for e in entries:
        out.append("".join(e if hashed else re.sub(r"\\(.)", r"\1", lit)
                           for lit, hashed in pieces))
    return out


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS - 3] + "..."


# A path with at least one directory: everything up to its last "/" goes.
_DIRS = re.compile(r"(?<![\w.~-])(?:[A-Za-z]:)?/(?:[^\s/:()'\"<>,]+/)+")


def strip_paths(text: str) -> str:
    """`text` with the folders of every path dropped (`/home/x/harness/f.py:12` ->
    `f.py:12`): an exception's message or its innermost frame names the machine's files,
    and a scoring message is shown to the submitter."""
    return _DIRS.sub("", text)

