"""compute-sanitizer on a submission, before it is timed.

Each of memcheck (out-of-bounds and misaligned accesses), racecheck (shared-memory
hazards), initcheck (reads of uninitialised global memory) and synccheck (barrier misuse)
runs `python -m harness.execution.sanitize_target` on a few small cases chosen from what
the kernel declares (`sanitizer_cases`: partial tiles in both sequence lengths, every mask
kind it supports, GQA when it supports it, each dtype; racecheck, the slow one, on a
lighter set, `racecheck_cases`). The tools run in parallel, one process each. Any finding
is `incorrect`, with the tool's one-line summary; so is a tool that could not finish (a
kernel that is slow enough under a tool would otherwise never be checked by it); a
missing tool is said so (`status: "unavailable"`) and scoring goes on.

The summary is rebuilt from the parsed report (harness.execution.sanitize_report), never
copied: host backtraces and library paths are dropped.

The same tools are the CI gate's sanitizer tier (`fa-harness ci --sanitize fast|full`,
`TIERS`) on the team's own variants, built there as the gate builds them (`trusted`).

The passes (`passes`): the forward's launches, the backward's, or both, case by case
(`sanitize_target --backward`, `--no-forward`). The gate's tier and `fa-harness run
--sanitize` run both for a variant that declares a backward (`variant_passes`), so a
backward that writes past its buffers is seen wherever a forward's would be; the
submission worker sanitizes the backward on its own (harness.submissions.scoring_bwd), so
that the backward's finding is the backward's verdict, never the forward's.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.candidate import Support
from harness.core.cases import Case, MaskKind
from harness.execution.sanitize_report import SanitizeReport, ToolReport, parse

__all__ = ["SanitizeReport", "ToolReport", "parse", "sanitize", "sanitizer_path", "TIERS"]

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
PASSES = ("fwd", "bwd")
ENV_VAR = "FA_HARNESS_COMPUTE_SANITIZER"
DEFAULT_TIMEOUT_S = 120.0
# racecheck's report: "analysis" (the races, analysed), "hazard" (every hazard), "all".
# The parser reads the analysis lines ("Race reported between ..."). Reporting every hazard
# is what makes a racy kernel slow under the tool: on the H200, racecheck on racy_rows.cu
# ran past 50 s with "all", and with "analysis" reported its race in 11 s (fa2_mma: clean
# in 5.6 s), results/h200-20261201/racecheck-analysis.json.
RACECHECK_REPORT = "analysis"
# memcheck's padding after every allocation (see `command`): more than the 3 MiB a planted
# far write reaches past its buffer.
PADDING_BYTES = 16 << 20


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


# --------------------------------------------------------------------------- running


@functools.cache
def _supports_padding(sanitizer: str) -> bool:
    try:
        out = subprocess.run([sanitizer, "--help"], capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return "--padding" in out.stdout + out.stderr


def command(sanitizer: str, tool: str, variant_path: str, cases: list[Case], *,
            trusted: bool = False, name: str | None = None,
            passes: tuple[str, ...] = ("fwd",)) -> list[str]:
    """The compute-sanitizer command line of one tool on `cases`, running the launches of
    `passes` ("fwd", "bwd" or both) of the variant."""
    bad = [x for x in passes if x not in PASSES]
    if bad or not passes:
        raise ValueError(f"passes must be some of {PASSES}, got {passes!r}")
    cmd = [sanitizer, "--tool", tool, "--error-exitcode", "99", "--print-limit", "20",
           "--show-backtrace", "device", "--target-processes", "all"]
    if tool == "racecheck":
        cmd += ["--racecheck-report", RACECHECK_REPORT]
    if tool == "memcheck" and _supports_padding(sanitizer):
        # A write far past its buffer can land inside another live allocation, where
        # memcheck sees a valid address (a kernel writing 3 MiB past O passed the full
        # grid that way): padding after every allocation turns such a write into an
        # access of no allocation. With torch's caching allocator off in the target
        # (run_tool), every tensor is its own allocation and gets its own padding.
        cmd += ["--padding", str(PADDING_BYTES)]
    target = [sys.executable, "-m", "harness.execution.sanitize_target",
              "--variant", variant_path, "--cases", ",".join(c.id for c in cases)]
    if name:  # one of the folder's [[flavor]]s
        target += ["--name", name]
    if "bwd" in passes:
        target += ["--backward"]
    if "fwd" not in passes:
        target += ["--no-forward"]
    return cmd + target + (["--trusted"] if trusted else [])


def run_tool(tool: str, variant_path: str, cases: list[Case], names: set[str],
             timeout_s: float = DEFAULT_TIMEOUT_S, sanitizer: str | None = None, *,
             trusted: bool = False, name: str | None = None,
             passes: tuple[str, ...] = ("fwd",)) -> ToolReport:
    exe = sanitizer or sanitizer_path()
    if exe is None:
        return ToolReport(tool, "unavailable", 0, "compute-sanitizer not found")
    t0 = time.monotonic()
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    try:
        proc = subprocess.run(command(exe, tool, variant_path, cases, trusted=trusted,
                                      name=name, passes=passes),
                              capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired:
        return ToolReport(tool, "timeout", 0, f"{tool}: did not finish within {timeout_s:g} s",
                          time.monotonic() - t0)
    except OSError as e:
        return ToolReport(tool, "unavailable", 0, f"cannot run compute-sanitizer: {e.strerror}")
    rep = parse(tool, proc.stdout + "\n" + proc.stderr, names)
    rep.wall_s = time.monotonic() - t0
    rep.raw = (proc.stdout + "\n" + proc.stderr)[-20000:]
    return rep


@dataclass(frozen=True)
class Tier:
    """Which tools run on how many cases: `full` is the submission worker's stage (and
    `ci --sanitize full`, nightly); `fast` is the per-commit gate's (`ci`'s default where
    compute-sanitizer exists): out-of-bounds and uninitialised reads on two small cases,
    racecheck on one."""

    tools: tuple[str, ...]
    cases: int
    race_cases: int


TIERS = {"full": Tier(TOOLS, 6, 3), "fast": Tier(("memcheck", "initcheck", "racecheck"), 2, 1)}


def sanitize(variant_path: str, support: Support, names: set[str], *,
             tools: tuple[str, ...] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
             sanitizer: str | None = None, tier: str = "full",
             trusted: bool = False, name: str | None = None,
             passes: tuple[str, ...] = ("fwd",)) -> SanitizeReport:
    """The tier's tools on `sanitizer_cases(support)` (racecheck on `racecheck_cases`),
    in parallel. `trusted`: the team's own source, built with NVRTC in the target as the
    gate builds it (not in the submission sandbox). `name`: the folder's `[[flavor]]` of
    that name instead of the variant itself. `passes`: the module doc."""
    spec_t = TIERS[tier]
    tools = tools or spec_t.tools
    exe = sanitizer or sanitizer_path()
    cases = sanitizer_cases(support, max_cases=spec_t.cases)
    if exe is None:
        return SanitizeReport("unavailable", [ToolReport(t, "unavailable", 0,
                                                         "compute-sanitizer not found")
                                              for t in tools], [c.id for c in cases])
    t0 = time.monotonic()
    if not trusted:
        _prebuild(variant_path, name)
    race = racecheck_cases(support)[:spec_t.race_cases]

    def one(t: str) -> ToolReport:
        return run_tool(t, variant_path, race if t == "racecheck" else cases, names,
                        timeout_s, exe, trusted=trusted, name=name, passes=passes)

    with ThreadPoolExecutor(max_workers=len(tools)) as pool:
        reports = list(pool.map(one, tools))
    status = ("findings" if any(r.status == "findings" for r in reports) else
              "failed" if any(r.status in ("failed", "timeout") for r in reports) else "clean")
    ids = [c.id for c in cases] + [c.id for c in race if c not in cases]
    return SanitizeReport(status, reports, ids, time.monotonic() - t0)


def _prebuild(variant_path: str, name: str | None = None) -> None:
    """Build the -lineinfo cubin the tools' targets load, once, before they start in
    parallel (a failure is left for the targets to report)."""
    import dataclasses

    try:
        import torch

        from harness.candidates.sandboxed_compile import build_cubin
        from harness.candidates.variants import load_variant

        if not torch.cuda.is_available():
            return
        spec = load_variant(variant_path, name)
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


def variant_passes(candidate: Any) -> tuple[str, ...]:
    """The passes the gate's tier and `run --sanitize` check: the backward's too when the
    variant declares one."""
    return PASSES if getattr(candidate.support, "backward", False) else ("fwd",)


@dataclass
class SanitizeOutcome:
    """One variant through one tier: its one line, and whether it fails the run (a
    finding, or a tool that could not finish: a kernel slow enough under a tool would
    otherwise never be checked by it)."""

    name: str
    line: str
    failed: bool
    report: SanitizeReport | None = None


def sanitize_variants(candidates: list[Any], *, tier: str = "full", trusted: bool = True,
                      parallel: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S
                      ) -> list[SanitizeOutcome]:
    """Every CUDA variant among `candidates` through the tier, `parallel` variants at a
    time (each runs its tools side by side). Without compute-sanitizer: one line each,
    nothing failed (the caller decides whether that is acceptable)."""
    exe = sanitizer_path()
    work = [(c, p) for c in candidates if (p := variant_path_of(c)) is not None]

    def one(item: tuple[Any, str]) -> SanitizeOutcome:
        cand, path = item
        if exe is None:
            return SanitizeOutcome(cand.name, f"sanitize {cand.name}: compute-sanitizer not "
                                   "found, not run", False)
        passes = variant_passes(cand)
        rep = sanitize(path, cand.support, source_names(cand), sanitizer=exe, tier=tier,
                       trusted=trusted, timeout_s=timeout_s, name=cand.name, passes=passes)
        if rep.status == "clean":
            tools = ", ".join(t.tool for t in rep.tools)
            what = "forward and backward" if "bwd" in passes else "forward"
            return SanitizeOutcome(cand.name, f"sanitize {cand.name}: clean ({tools}; "
                                   f"{len(rep.cases)} case(s), {what}, {rep.wall_s:.1f} s)",
                                   False, rep)
        bad = rep.finding or rep.unchecked
        return SanitizeOutcome(cand.name, f"sanitize {cand.name}: "
                               f"{bad.summary if bad else rep.status}", True, rep)

    if parallel <= 1 or len(work) <= 1:
        return [one(item) for item in work]
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return list(pool.map(one, work))


def sanitize_candidates(candidates: list[Any]) -> list[tuple[str, bool]]:
    """`fa-harness run --sanitize`: one line per CUDA candidate, and whether it had a
    finding (a failed or timed-out tool counts as one); every tool (the full tier), on
    the backward too where one is declared."""
    return [(o.line, o.failed) for o in sanitize_variants(candidates, tier="full")]
