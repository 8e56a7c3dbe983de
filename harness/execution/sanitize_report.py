"""Reading compute-sanitizer's report: one line per tool, rebuilt from the parsed report
(kind of access, kernel, offset, source line in a submission file, distance from the
allocation), never copied: host backtraces and library paths are dropped. The tools
themselves are run by harness.execution.sanitize.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

PREFIX = "========="
_SUMMARY = re.compile(r"ERROR SUMMARY:\s*([\d,]+)\s+errors?")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*([\d,]+)\s+hazards?\s+displayed\s*"
                           r"\(([\d,]+)\s+errors?,\s*([\d,]+)\s+warnings?\)")
_HEADERS = (
    re.compile(r"^(Invalid __\w+__ (?:read|write|atomic) of size [\d,]+ bytes?)"),
    re.compile(r"^(Misaligned (?:Shared or Local )?Address)"),
    re.compile(r"^(Uninitialized __\w+__ memory read of size [\d,]+ bytes?)"),
    re.compile(r"^(?:Error|Warning): (Race reported between \w+ access)"),
    re.compile(r"^(Barrier error detected\.[^.]*)"),
    re.compile(r"^(Program hit (?:cuda|CUDA_)\w+ \(error \d+\))"),
    re.compile(r"^(Invalid (?:PC|configuration)[^.]*)"),
    re.compile(r"^(Out-of-range Shared or Local Address)"),
)
_AT = re.compile(r"^at (?:(?P<fn>[A-Za-z_][\w:<>, ()*&]*?)\+(?P<off>0x[0-9a-f]+))?"
                 r"(?:\s*in\s+(?P<file>[\w./\-]+):(?P<line>\d+))?")
_AND_ACCESS = re.compile(r"^and (\w+) access at ")
_DISTANCE = re.compile(r"and is ([\d,]+) bytes (after|before) the nearest allocation")
_ALLOC_SIZE = re.compile(r"of size ([\d,]+) bytes")
_TARGET_FAIL = re.compile(r"^sanitize_target: (.{1,200})$", re.M)


@dataclass
class ToolReport:
    tool: str
    status: str  # "clean", "findings", "failed", "unavailable", "timeout"
    errors: int = 0
    summary: str = ""
    wall_s: float = 0.0
    raw: str = field(default="", repr=False)  # the report itself, for diagnosis; never shown

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("raw")
        d["wall_s"] = round(self.wall_s, 2)
        return d


@dataclass
class SanitizeReport:
    status: str  # "clean", "findings", "unavailable", "failed"
    tools: list[ToolReport] = field(default_factory=list)
    cases: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def finding(self) -> ToolReport | None:
        return next((t for t in self.tools if t.status == "findings"), None)

    @property
    def unchecked(self) -> ToolReport | None:
        """A tool that ran but could not finish its check (timed out, or died without a
        report): the submission is then not known to be clean."""
        return next((t for t in self.tools if t.status in ("timeout", "failed")), None)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "cases": self.cases, "wall_s": round(self.wall_s, 2),
                "tools": [t.to_dict() for t in self.tools]}


def _body(text: str) -> list[str]:
    """The sanitizer's own lines, prefix removed, stripped (the target's output dropped)."""
    return [ln[len(PREFIX):].strip() for ln in text.splitlines() if ln.startswith(PREFIX)]


def _int(s: str) -> int:
    return int(s.replace(",", ""))


def parse(tool: str, text: str, names: set[str] | None = None) -> ToolReport:
    """One tool's report. `errors` from the summary line; `summary` from the first finding.
    No summary line at all (the tool or target died) is `failed`."""
    names = names or set()
    body = _body(text)
    errors: int | None = None
    for ln in body:
        m = _RACE_SUMMARY.search(ln)
        if m:
            errors = _int(m.group(2)) + _int(m.group(3))
        m = _SUMMARY.search(ln)
        if m:
            errors = _int(m.group(1))
    first = _first_finding(body, names)
    if errors is None:
        why = first or _target_failure(text) or "no summary line in the report"
        return ToolReport(tool, "failed", 0, f"{tool}: {why}")
    if errors == 0 and first is None:
        return ToolReport(tool, "clean", 0, "")
    n = max(errors, 1)
    return ToolReport(tool, "findings", n,
                      f"{tool}: {n} error{'s' if n != 1 else ''}: {first or 'see the report'}")


def _first_finding(body: list[str], names: set[str]) -> str | None:
    for i, ln in enumerate(body):
        for h in _HEADERS:
            m = h.match(ln)
            if not m:
                continue
            parts = [m.group(1)]
            rest = ln[m.end():]
            at = _AT.match(rest.strip()) if rest.strip().startswith("at ") else None
            follow = body[i + 1:i + 8]
            if at is None:
                for f in follow:
                    if f.startswith("at "):
                        at = _AT.match(f)
                        # "in FILE:LINE" may sit on its own line below.
                        nxt = follow[follow.index(f) + 1] if follow.index(f) + 1 < len(follow) else ""
                        if at and not at.group("file") and nxt.startswith("in "):
                            at = _AT.match(f + " " + nxt) or at
                        break
            if at and at.group("fn"):
                parts.append(f"in {_function(at.group('fn'))}+{at.group('off')}")
            if at and at.group("file"):
                base = at.group("file").rsplit("/", 1)[-1]
                if base in names or not names:
                    parts.append(f"at {base}:{at.group('line')}")
            for f in follow:
                a = _AND_ACCESS.match(f)
                if a:
                    parts.append(f"and {a.group(1)} access")
                    break
            joined = " ".join(follow)
            dist = _DISTANCE.search(joined)
            if dist:
                size = _ALLOC_SIZE.search(joined[dist.end():])
                parts.append(f"({dist.group(1)} bytes {dist.group(2)} an allocation"
                             + (f" of {size.group(1)} bytes)" if size else ")"))
            return " ".join(parts)
    return None


def _function(fn: str) -> str:
    """A frame's function without its parameter list: the balanced `(...)` at its end. Not
    everything from the first `(`: a template argument can hold one too (a device function
    `pb_main<(int)0>(const FaParams &)` was cut to `pb_main<`)."""
    fn = fn.strip()
    depth = 0
    for i in range(len(fn) - 1, -1, -1) if fn.endswith(")") else ():
        depth += {")": 1, "(": -1}.get(fn[i], 0)
        if depth == 0:
            fn = fn[:i]
            break
    return fn.strip()[:80]


def _target_failure(text: str) -> str | None:
    m = _TARGET_FAIL.search(text)
    return m.group(1) if m else None
