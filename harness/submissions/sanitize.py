"""compute-sanitizer on a submission, before it is timed.

Each of memcheck (out-of-bounds and misaligned accesses), racecheck (shared-memory
hazards), initcheck (reads of uninitialised global memory) and synccheck (barrier misuse)
runs `python -m harness.submissions.sanitize_target` on a few small cases chosen from what
the kernel declares (`sanitizer_cases`: partial tiles in both sequence lengths, every mask
kind it supports, GQA when it supports it, each dtype; racecheck, the slow one, on a
lighter set, `racecheck_cases`). The tools run in parallel, one process each. Any finding
is `incorrect`, with the tool's one-line summary; so is a tool that could not finish (a
kernel that is slow enough under a tool would otherwise never be checked by it); a
missing tool is said so (`status: "unavailable"`) and scoring goes on.

The summary is rebuilt from the parsed report (kind of access, kernel, offset, source line
in a submission file, distance from the allocation), never copied: host backtraces and
library paths are dropped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.candidate import Support
from harness.core.cases import Case, MaskKind

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
ENV_VAR = "FA_HARNESS_COMPUTE_SANITIZER"
DEFAULT_TIMEOUT_S = 120.0
# racecheck's report: "analysis" (the races, analysed), "hazard" (every hazard), "all".
# The parser reads the analysis lines ("Race reported between ..."). Reporting every hazard
# is what makes a racy kernel slow under the tool: on the H200, racecheck on racy_rows.cu
# ran past 50 s with "all", and with "analysis" reported its race in 11 s (fa2_mma: clean
# in 5.6 s), results/h200-20261201/racecheck-analysis.json.
RACECHECK_REPORT = "analysis"
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


def sanitizer_path() -> str | None:
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return explicit if Path(explicit).is_file() else None
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    nvcc = shutil.which("nvcc")
    if nvcc:
        from harness.candidates.sandbox import toolchain_root

        cand = toolchain_root(nvcc) / "bin" / "compute-sanitizer"
        if cand.is_file():
            return str(cand)
    return None


# --------------------------------------------------------------------------- cases


def sanitizer_cases(support: Support, max_cases: int = 6) -> list[Case]:
    """A few small cases that reach the code paths a kernel declares: partial tiles (113 x
    203 and 203 x 113), every supported mask kind, GQA if supported, both dtypes, a decode
    row. Small enough that the slowest tool (racecheck) takes seconds."""
    dtypes = sorted(support.dtypes) or ["float16"]
    dims = sorted(support.head_dims) if support.head_dims else [64]
    d = 64 if 64 in dims else dims[0]
    masks = [m for m in MaskKind if m in support.masks] or [MaskKind.NONE]
    heads, kv = (4, 2) if support.gqa else (2, 2)
    shapes = [(113, 203), (203, 113), (1, 239), (64, 64)]
    pool: list[Case] = []
    for i, mask in enumerate(masks):
        nq, nk = shapes[i % 2]
        pool.append(Case(2, heads, kv, nq, nk, d, dtypes[i % len(dtypes)], mask))
    pool.append(Case(1, heads, kv, 1, 239, d, dtypes[-1], masks[0]))
    out: list[Case] = []
    for c in pool:
        if support.reason_unsupported(c) is None and c not in out:
            out.append(c)
    # Keep the mask variety, drop the rest past max_cases.
    return out[:max_cases]


def racecheck_cases(support: Support) -> list[Case]:
    """racecheck's own, lighter set: it tracks every shared-memory access of every block,
    so it is the slowest tool on a kernel that stages tiles in shared memory. A hazard is
    between threads of one block, so one batch entry and one head group suffice: the
    first two cases above (partial tiles, two mask kinds) and the decode row, at a
    quarter of the blocks or fewer."""
    heads, kv = (2, 1) if support.gqa else (1, 1)
    out: list[Case] = []
    for c in sanitizer_cases(support):
        small = Case(1, heads, kv, c.seqlen_q, c.seqlen_k, c.head_dim, c.dtype, c.mask)
        if support.reason_unsupported(small) is None and small not in out:
            out.append(small)
    decode = [c for c in out if c.seqlen_q == 1]
    return (out[:2] + decode[:1])[:3]


# --------------------------------------------------------------------------- parsing


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
                fn = re.sub(r"\(.*$", "", at.group("fn")).strip()[:80]
                parts.append(f"in {fn}+{at.group('off')}")
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


def _target_failure(text: str) -> str | None:
    m = _TARGET_FAIL.search(text)
    return m.group(1) if m else None


# --------------------------------------------------------------------------- running


def command(sanitizer: str, tool: str, variant_path: str, cases: list[Case]) -> list[str]:
    cmd = [sanitizer, "--tool", tool, "--error-exitcode", "99", "--print-limit", "20",
           "--show-backtrace", "device", "--target-processes", "all"]
    if tool == "racecheck":
        cmd += ["--racecheck-report", RACECHECK_REPORT]
    return cmd + [sys.executable, "-m", "harness.submissions.sanitize_target",
                  "--variant", variant_path, "--cases", ",".join(c.id for c in cases)]


def run_tool(tool: str, variant_path: str, cases: list[Case], names: set[str],
             timeout_s: float = DEFAULT_TIMEOUT_S, sanitizer: str | None = None) -> ToolReport:
    exe = sanitizer or sanitizer_path()
    if exe is None:
        return ToolReport(tool, "unavailable", 0, "compute-sanitizer not found")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(command(exe, tool, variant_path, cases), capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return ToolReport(tool, "timeout", 0, f"{tool}: did not finish within {timeout_s:g} s",
                          time.monotonic() - t0)
    except OSError as e:
        return ToolReport(tool, "unavailable", 0, f"cannot run compute-sanitizer: {e.strerror}")
    rep = parse(tool, proc.stdout + "\n" + proc.stderr, names)
    rep.wall_s = time.monotonic() - t0
    rep.raw = (proc.stdout + "\n" + proc.stderr)[-20000:]
    return rep


def sanitize(variant_path: str, support: Support, names: set[str], *,
             tools: tuple[str, ...] = TOOLS, timeout_s: float = DEFAULT_TIMEOUT_S,
             sanitizer: str | None = None) -> SanitizeReport:
    """Every tool on `sanitizer_cases(support)`, in parallel."""
    exe = sanitizer or sanitizer_path()
    cases = sanitizer_cases(support)
    if exe is None:
        return SanitizeReport("unavailable", [ToolReport(t, "unavailable", 0,
                                                         "compute-sanitizer not found")
                                              for t in tools], [c.id for c in cases])
    t0 = time.monotonic()
    _prebuild(variant_path)
    race = racecheck_cases(support)

    def one(t: str) -> ToolReport:
        return run_tool(t, variant_path, race if t == "racecheck" else cases, names,
                        timeout_s, exe)

    with ThreadPoolExecutor(max_workers=len(tools)) as pool:
        reports = list(pool.map(one, tools))
    status = ("findings" if any(r.status == "findings" for r in reports) else
              "failed" if any(r.status in ("failed", "timeout") for r in reports) else "clean")
    ids = [c.id for c in cases] + [c.id for c in race if c not in cases]
    return SanitizeReport(status, reports, ids, time.monotonic() - t0)


def _prebuild(variant_path: str) -> None:
    """Build the -lineinfo cubin the tools' targets load, once, before they start in
    parallel (a failure is left for the targets to report)."""
    import dataclasses

    try:
        import torch

        from harness.candidates.sandboxed_compile import build_cubin
        from harness.candidates.variants import load_variant

        if not torch.cuda.is_available():
            return
        spec = load_variant(variant_path)
        if "-lineinfo" not in spec.compile_options:
            spec = dataclasses.replace(spec, compile_options=(*spec.compile_options,
                                                              "-lineinfo"))
        build_cubin(spec, tuple(torch.cuda.get_device_capability()))
    except Exception:  # noqa: BLE001 - the targets report a build failure themselves
        return


def variant_path_of(candidate: Any) -> str | None:
    """The folder or annotated .cu a CUDA candidate was loaded from."""
    manifest = (candidate.meta or {}).get("manifest_path")
    if getattr(candidate, "kind", "") != "cuda" or not manifest:
        return None
    p = Path(manifest)
    return str(p.parent if p.name == "manifest.toml" else p)


def source_names(candidate: Any) -> set[str]:
    spec = getattr(candidate, "spec", None)
    labels = [label for label, _ in getattr(spec, "source_texts", ())]
    return {label.rsplit("/", 1)[-1] for label in labels}


def sanitize_candidates(candidates: list[Any]) -> list[tuple[str, bool]]:
    """`fa-harness run --sanitize`: one line per CUDA candidate, and whether it had a
    finding (a failed or timed-out tool counts as one)."""
    lines: list[tuple[str, bool]] = []
    exe = sanitizer_path()
    for cand in candidates:
        path = variant_path_of(cand)
        if path is None:
            continue
        if exe is None:
            lines.append((f"sanitize {cand.name}: compute-sanitizer not found, not run", False))
            continue
        rep = sanitize(path, cand.support, source_names(cand), sanitizer=exe)
        if rep.status == "clean":
            lines.append((f"sanitize {cand.name}: clean ({', '.join(TOOLS)}; "
                          f"{len(rep.cases)} cases, {rep.wall_s:.1f} s)", False))
        else:
            bad = [t for t in rep.tools if t.status != "clean"]
            lines.append((f"sanitize {cand.name}: {bad[0].summary if bad else rep.status}",
                          True))
    return lines
