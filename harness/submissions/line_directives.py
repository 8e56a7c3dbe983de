"""`#line` directives and GCC linemarkers (`# 12 "file" 1`) in submitted source.

Both tell the compiler which file and line the following text comes from. The harness
decides what a submission includes and defines from the preprocessor's output
(`harness.submissions.preprocess`), and shows compiler messages by file and line
(`harness.submissions.diagnostics`): a submission that could rename its own lines (to
`fa_harness.h`, say) would choose how it is judged. Submissions have no use for either, so
any such directive refuses the submission before any other check.

The directive is looked for the way the preprocessor reads the text: lines joined at a
backslash-newline (GCC also joins when spaces follow the backslash), comments, string,
character and raw string literals (`R"d(...)d"`, whose content is taken verbatim), digit
separators (`1'000`). A lexer that disagreed with the compiler about where a literal or a
comment ends could miss a directive the compiler obeys, so the text is scanned three
ways and any one finding refuses: with literals and comments, with comments only, and
with neither (only line joins and whitespace). The last two refuse a line that merely
looks like a directive inside a comment or a raw string too; no kernel needs such a line.

The same lexer refuses every other directive a submission may not use (the list of
`harness.submissions.sources`: `#include_next`, `#import`, `#embed`, `#ident`, ...), so a
line splice or a raw string cannot hide one from that check either.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

from harness.submissions.sources import ALLOWED_DIRECTIVES

# GCC joins a backslash, optional horizontal whitespace and a newline.
_SPLICE = re.compile(r"\\[ \t\f\v]*\n")
# Letters, digits, `_` and `$` in any script, as GCC reads identifiers; other characters
# (a stray curly quote) are single tokens, so none can make `xR"` look like a prefix.
_IDENT = r"(?:[^\W\d]|\$)[\w$]*"
# One token of the text after line joining. A pp-number swallows letters, dots, exponent
# signs and digit separators (`0x1'R` is one number: no raw string starts there).
_TOKEN = re.compile(
    r"(?P<ws>[ \t\f\v]+)|(?P<nl>\n)|(?P<lc>//)|(?P<bc>/\*)|(?P<q>[\"'])|(?P<hash>#|%:)"
    rf"|(?P<id>{_IDENT})"
    r"|(?P<num>\.?[0-9](?:[eEpP][+-]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*)|(?P<other>.)", re.S)
# A run of tokens none of which can start a literal, a comment or a directive, skipped in
# one step: identifiers not followed by a quote (one that is may be a literal's prefix;
# the atomic group keeps `xR"` from being read as `x` and `R"`), numbers, spaces and the
# punctuation that is not `/`, `#`, `%:` or a quote, and newlines (a line starts after
# the run's last one).
_RUN = re.compile(
    rf"(?:[ \t\f\v\n]+|(?>{_IDENT})(?![\"'])|(?>\.?[0-9](?:[eEpP][+-]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*)"
    r"|/(?![/*])|%(?!:)|\.(?![0-9])|[^\n\"'/#%.\w$])+")
_RAW_PREFIXES = frozenset({"R", "LR", "uR", "UR", "u8R"})
_RAW_DELIM = re.compile(r'"([^ ()\\\t\v\f\n"]{0,16})\(')
_STRING = {'"': re.compile(r'"(?:[^"\\\n]|\\.)*(?:"|(?=\n)|\Z)', re.S),
           "'": re.compile(r"'(?:[^'\\\n]|\\.)*(?:'|(?=\n)|\Z)", re.S)}
_WS_OR_COMMENT = re.compile(r"(?:[ \t\f\v]+|/\*.*?(?:\*/|\Z))*", re.S)
_NAME = re.compile(rf"{_IDENT}|[0-9]|\\")
_HEADER = re.compile(r"[ \t\f\v]*<[^>\n]*>?")
# Without literals or comments: `#` and the directive's name with only spaces between.
_PLAIN = re.compile(r"^[ \t\f\v]*(?:#|%:)[ \t\f\v]*(?:line\b|[0-9]|\\)", re.M)


@dataclass(frozen=True)
class LineDirective:
    file: str
    line: int
    literal_blind: bool  # found only when literals (or comments too) are not recognised
    directive: str = "line"  # or the name of another directive a submission may not use

    def __str__(self) -> str:
        where = (" (refused even inside a comment or a literal)" if self.literal_blind
                 else "")
        if self.directive != "line":
            return (f"{self.file}:{self.line}: preprocessor directive #{self.directive} is "
                    f"not allowed{where}")
        return (f"{self.file}:{self.line}: #line directives and linemarkers (# <number> "
                f"\"file\") are not allowed in a submission: they change which file and "
                f"line the compiler takes the following text for{where}")


class _Text:
    """The text with lines joined, and the way back to the original's lines and offsets
    (raw string literals are read from the original: a join inside one is undone)."""

    def __init__(self, text: str):
        # GCC skips a byte order mark, so a directive right after one is at a line start.
        self.orig = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
        parts: list[str] = []
        self.at: list[int] = []  # offset in the joined text where a join was removed
        self.removed: list[int] = []  # characters removed up to and including that join
        self.orig_at: list[int] = []  # the join's end in the original
        last = removed = 0
        for m in _SPLICE.finditer(self.orig):
            parts.append(self.orig[last:m.start()])
            removed += m.end() - m.start()
            self.at.append(m.start() - (removed - (m.end() - m.start())))
            self.removed.append(removed)
            self.orig_at.append(m.end())
            last = m.end()
        parts.append(self.orig[last:])
        self.joined = "".join(parts)

    def to_orig(self, pos: int) -> int:
        k = bisect_right(self.at, pos)
        return pos + (self.removed[k - 1] if k else 0)

    def to_joined(self, opos: int) -> int:
        k = bisect_right(self.orig_at, opos)
        return opos - (self.removed[k - 1] if k else 0)

    def line(self, pos: int) -> int:
        return self.orig.count("\n", 0, self.to_orig(pos)) + 1


def _scan(t: _Text, *, literals: bool, comments: bool) -> tuple[int, str] | None:
    """Offset (joined text) and name ("line" for a linemarker) of the first `#line`,
    linemarker or directive a submission may not use, or None."""
    s = t.joined
    n = len(s)
    i = 0
    line_start = True
    while i < n:
        run = _RUN.match(s, i)
        if run:
            text = run.group()
            lines = text.rsplit("\n", 1)
            if len(lines) == 2:
                line_start = not lines[1].strip(" \t\f\v")
            else:
                line_start = line_start and not text.strip(" \t\f\v")
            i = run.end()
            continue
        m = _TOKEN.match(s, i)
        assert m is not None  # `other` matches any character
        kind = m.lastgroup
        j = m.end()
        if kind == "nl":
            line_start = True
        elif kind == "ws":
            pass
        elif kind in ("lc", "bc") and comments:
            if kind == "lc":
                k = s.find("\n", j)
                j = n if k < 0 else k
            else:
                k = s.find("*/", j)
                end = n if k < 0 else k + 2
                # A newline inside the comment counts as a line start: whether a `#`
                # after such a comment begins a directive is the compiler's to decide,
                # and the scan errs towards looking.
                line_start = line_start or "\n" in s[i:end]
                j = end
        elif kind == "q" and literals:
            sm = _STRING[m.group()].match(s, i)
            j = sm.end() if sm else j
            line_start = False
        elif kind == "hash" and line_start:
            k = _WS_OR_COMMENT.match(s, j).end() if comments else j
            while k < n and s[k] in " \t\f\v":
                k += 1
            name = _NAME.match(s, k)
            if name and (name.group() == "line" or name.group()[0] in "0123456789\\"):
                return i, "line"
            if name and name.group() not in ALLOWED_DIRECTIVES:
                return i, name.group()[:32]
            line_start = False
            if name and name.group() in ("include", "include_next", "import"):
                # A header name (`<a/*b>`) is one token: no comment starts inside it.
                hm = _HEADER.match(s, name.end())
                j = hm.end() if hm else name.end()
        elif kind == "id" and literals and m.group() in _RAW_PREFIXES and s.startswith('"', j):
            d = _RAW_DELIM.match(s, j)
            line_start = False
            if d:
                start = t.to_orig(d.end())
                close = t.orig.find(")" + d.group(1) + '"', start)
                j = n if close < 0 else t.to_joined(close + len(d.group(1)) + 2)
        else:
            line_start = False
        i = max(j, i + 1)
    return None


def find_line_directive(name: str, text: str) -> LineDirective | None:
    """The first `#line` or linemarker of `text` (see the module doc), or None."""
    t = _Text(text)
    for literals, comments in ((True, True), (False, True)):
        found = _scan(t, literals=literals, comments=comments)
        if found is not None:
            return LineDirective(name, t.line(found[0]), literal_blind=not literals,
                                 directive=found[1])
    m = _PLAIN.search(t.joined)
    if m:
        return LineDirective(name, t.line(m.start() + len(m.group()) - 1), literal_blind=True)
    return None
