"""Building kernel variants with nvcc, on any machine (no GPU needed): the per-entry
resource reports (registers, spills, shared memory, stack, parsed from ptxas' report),
the cubin cache of trusted builds, and `compile_all_nvcc` (`fa-harness kernels
--compile`: every variant for every arch, side by side, a report line as each lands).
`compile_with_timeout` is the same for one source string (submissions build theirs in
the sandbox, harness.candidates.sandboxed_compile).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.candidates.variants import ARCH_RE, VariantSpec, load_specs

NVCC_TIMEOUT_S = 300.0
CXX_STD = "-std=c++17"


# ------------------------------------------------------------------------------------
# Reports
# ------------------------------------------------------------------------------------


@dataclass
class CompileReport:
    """Resources of one entry point compiled for one arch (or why it did not compile)."""

    variant: str
    entry: str
    arch: str
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    shared_bytes: int | None = None  # static shared memory
    stack_bytes: int | None = None
    # ptxas could not keep the warpgroup MMAs in flight and made each wait for the last
    # (its warnings C7511, C7512, C7520): correct, but off the fast path (25% slower seen).
    wgmma_serialized: bool = False
    ok: bool = True
    message: str = ""
    cached: bool = False  # from the cubin cache: nothing was compiled

    @property
    def spills(self) -> int:
        return (self.spill_stores or 0) + (self.spill_loads or 0)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def format_reports(reports: Iterable[CompileReport]) -> str:
    """A fixed-width table, one line per (variant, entry, arch); failures show their
    compiler message below the table."""
    reports = list(reports)
    wv = max([7] + [len(r.variant) for r in reports])
    we = max([5] + [len(r.entry) for r in reports])
    header = f"{'variant':<{wv}} {'entry':<{we}} {'arch':<8} {'regs':>5} {'spill st/ld':>12} " \
             f"{'smem':>7} {'stack':>6}  status"
    lines = [header, "-" * len(header)]
    failures: list[CompileReport] = []

    def n(v: int | None) -> str:
        return "-" if v is None else str(v)

    for r in reports:
        if not r.ok:
            failures.append(r)
            status = "FAILED"
        elif r.registers is None:
            status = r.message or "skipped"
        elif r.wgmma_serialized:
            status = "WGMMA SERIALIZED"
        else:
            status = "ok" if r.spills == 0 else "SPILLS"
        spill = "-" if r.spill_stores is None else f"{r.spill_stores}/{r.spill_loads}"
        lines.append(f"{r.variant:<{wv}} {r.entry or '-':<{we}} {r.arch:<8} {n(r.registers):>5} "
                     f"{spill:>12} {n(r.shared_bytes):>7} {n(r.stack_bytes):>6}  {status}")
    for r in failures:
        lines.append("")
        lines.append(f"{r.variant} ({r.arch}): {r.message.strip()}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------
# nvcc (no GPU needed)
# ------------------------------------------------------------------------------------

_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
# C7511 and C7512 (registers), C7520 (a compiler-inserted arrive on a divergent path), ...:
# every reason ptxas gives names the function ("in" or "for the function 'name'").
_SERIAL_RE = re.compile(r"wgmma\.mma_async instructions are serialized.*(?:in|for) the function '([^']+)'")


@dataclass
class EntryResources:
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0
    wgmma_serialized: bool = False


def parse_ptxas(text: str) -> dict[str, EntryResources]:
    """Per entry function: registers, spills, static smem, stack from `-Xptxas -v`, and
    whether ptxas serialized its wgmma (a warning printed before the function's report)."""
    out: dict[str, EntryResources] = {}
    current: str | None = None
    props_for: str | None = None
    for line in text.splitlines():
        m = _SERIAL_RE.search(line)
        if m:
            out.setdefault(m.group(1), EntryResources()).wgmma_serialized = True
            continue
        m = _ENTRY_RE.search(line)
        if m:
            current = m.group(1)
            out.setdefault(current, EntryResources())
            continue
        m = _PROPS_RE.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = _FRAME_RE.search(line)
        if m and props_for is not None and props_for in out:
            r = out[props_for]
            r.stack_bytes, r.spill_stores, r.spill_loads = (int(g) for g in m.groups())
            continue
        m = _USED_RE.search(line)
        if m and current is not None:
            r = out[current]
            r.registers = int(m.group(1))
            s = _SMEM_RE.search(line)
            r.shared_bytes = int(s.group(1)) if s else 0
    return out


@dataclass
class NvccResult:
    ok: bool
    arch: str
    message: str  # compiler output (errors with file(line)), or the timeout
    resources: dict[str, EntryResources] = field(default_factory=dict)
    cubin: bytes | None = None
    timed_out: bool = False
    cached: bool = False  # taken from the cubin cache, not compiled now


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


@functools.cache
def nvcc_version() -> str:
    """nvcc's build line ("Build cuda_13.0.r13.0/compiler.36424714_0"): part of every
    cache key, so a new toolchain never reuses an old cubin; "none" without nvcc."""
    nvcc = nvcc_path()
    if nvcc is None:
        return "none"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown"


def build_key(*parts: str) -> str:
    """SHA-256 of the parts of a build (toolchain, arch, options, source)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def cubin_cache_dir() -> Path:
    """FA_HARNESS_CUBIN_CACHE, else cubin/ of the harness's compile caches."""
    from harness.paths import use_compile_caches

    return Path(use_compile_caches()["FA_HARNESS_CUBIN_CACHE"])


def write_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary file and a rename: a concurrent reader (another variant's
    build, a sanitizer's target) sees the whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def cached_nvcc(source: str, options: Sequence[str], timeout_s: float, *, arch: str,
                filename: str) -> NvccResult:
    """`compile_with_timeout` through the cubin cache: the cubin and ptxas' report of a
    trusted source (a team's own variant) are kept under the key of toolchain, arch,
    options and source, so `kernels --compile` on an unchanged tree compiles nothing.
    Failures are never cached."""
    key = build_key("nvcc", nvcc_version(), arch, CXX_STD, *options, source)
    folder = cubin_cache_dir()
    log, cub = folder / f"{key}.log", folder / f"{key}.cubin"
    if log.is_file() and cub.is_file():
        text = log.read_text()
        return NvccResult(True, arch, text, parse_ptxas(text), cub.read_bytes(), cached=True)
    res = compile_with_timeout(source, options, timeout_s, arch=arch, keep_cubin=True,
                               filename=filename)
    if res.ok and res.cubin is not None:
        with contextlib.suppress(OSError):  # a read-only cache only costs the next compile
            write_atomic(cub, res.cubin)
            write_atomic(log, res.message.encode())
    return res


def compile_with_timeout(source: str, options: Sequence[str] = (), timeout_s: float = 120.0,
                         *, arch: str = "sm_90", keep_cubin: bool = False,
                         filename: str = "variant.cu") -> NvccResult:
    """Compile `source` to a cubin with nvcc in a scratch folder, killing the compiler
    (its whole process group) past `timeout_s`. Works without a GPU."""
    nvcc = nvcc_path()
    if nvcc is None:
        return NvccResult(False, arch, "nvcc not found on PATH")
    with tempfile.TemporaryDirectory(prefix="fa-harness-nvcc-") as tmp:
        src = Path(tmp) / filename
        src.write_text(source)
        cubin = Path(tmp) / "out.cubin"
        cmd = [nvcc, "-cubin", *arch_flags(arch), "-Xptxas", "-v", CXX_STD, *options,
               "-o", str(cubin), str(src)]
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # nvcc runs cicc and ptxas as children: end the group it leads, not just nvcc.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return NvccResult(False, arch, f"nvcc timed out after {timeout_s:g} s",
                              timed_out=True)
        output = output.replace(str(src), filename)
        if proc.returncode != 0:
            errors = [ln for ln in output.splitlines() if not ln.startswith("ptxas info")]
            return NvccResult(False, arch, "\n".join(errors).strip() or
                              f"nvcc exited with {proc.returncode}")
        return NvccResult(True, arch, output, parse_ptxas(output),
                          cubin.read_bytes() if keep_cubin else None)


def arch_flags(arch: str) -> list[str]:
    """nvcc's flags for one arch. An arch-specific target (sm_90a: wgmma, setmaxnreg) is
    named in the -gencode form, virtual and real arch both `a`, so that no plain sm_90 pass
    sees instructions it rejects."""
    if arch.endswith("a"):
        num = arch[3:]
        return [f"-gencode=arch=compute_{num},code=sm_{num}"]
    return [f"-arch={arch}"]


def arch_for(spec: VariantSpec, target: str) -> str | None:
    """The -arch to build `spec` for target `sm_XY`: the manifest's arch when it names
    the same compute capability (sm_90a for sm_90), None when the variant needs a newer
    GPU than the target."""
    m = ARCH_RE.match(target)
    if not m:
        raise ValueError(f"not an arch: {target!r}")
    cc = (int(m.group(1)), int(m.group(2)))
    if cc < spec.min_compute_capability:
        return None
    if spec.arch:
        ma = ARCH_RE.match(spec.arch)
        if ma and (int(ma.group(1)), int(ma.group(2))) == cc:
            return spec.arch
        if spec.arch.endswith("a"):
            # An arch-specific build (wgmma, setmaxnreg) runs on that chip only: sm_90a
            # code neither loads on nor compiles for a newer GPU.
            return None
    return target


def unsupported_reason(spec: VariantSpec) -> str:
    """Why `arch_for` gave None: the GPU the variant needs."""
    if spec.arch.endswith("a"):
        return f"needs {spec.arch} (arch-specific instructions)"
    return "needs compute capability " + ".".join(map(str, spec.min_compute_capability))


def compile_spec_nvcc(spec: VariantSpec, target: str,
                      timeout_s: float = NVCC_TIMEOUT_S) -> list[CompileReport]:
    return spec_reports(spec, target, lambda arch: cached_nvcc(
        spec.full_source(), spec.compile_options, timeout_s, arch=arch,
        filename=f"{spec.name}.cu"))


def spec_reports(spec: VariantSpec, target: str,
                 build: Callable[[str], NvccResult]) -> list[CompileReport]:
    """One report per entry of `spec` from `build(arch)` (an nvcc run, here or in the
    sandbox), one failed report when the build fails, or one skipped report when the
    variant needs a newer GPU than `target`."""
    arch = arch_for(spec, target)
    if arch is None:
        return [CompileReport(spec.name, "", target, ok=True,
                              message=f"skipped: {unsupported_reason(spec)}")]
    res = build(arch)
    if not res.ok:
        return [CompileReport(spec.name, "", arch, ok=False, message=res.message)]
    reports = []
    for entry in spec.entry_names():
        r = res.resources.get(entry)
        if r is None:
            reports.append(CompileReport(spec.name, entry, arch, ok=False,
                                         message="entry point missing from the compiled code"))
            continue
        problems = [m for m, bad in (("register spills", r.spill_stores + r.spill_loads > 0),
                                     ("wgmma serialized by ptxas", r.wgmma_serialized))
                    if bad]
        reports.append(CompileReport(
            spec.name, entry, arch, registers=r.registers, spill_stores=r.spill_stores,
            spill_loads=r.spill_loads, shared_bytes=r.shared_bytes, stack_bytes=r.stack_bytes,
            wgmma_serialized=r.wgmma_serialized, ok=True, message="; ".join(problems),
            cached=res.cached))
    return reports


def compile_all_nvcc(archs: Sequence[str] = ("sm_80", "sm_90"), root: Path | str | None = None,
                     *, timeout_s: float = NVCC_TIMEOUT_S, jobs: int | None = None,
                     only: Sequence[str] | None = None,
                     on_report: Callable[[list[CompileReport], float], None] | None = None
                     ) -> list[CompileReport]:
    """Compile every variant under `root` (default: every discovered kernel folder,
    harness.candidates.discovery) for every arch with nvcc, one process per (variant,
    arch), every core busy. A variant whose manifest does not load gets one failed report
    carrying the load error. `on_report(reports, seconds)` is called as each (variant,
    arch) lands, so a CI log shows progress instead of nothing until the end."""
    if root is None:
        from harness.candidates.discovery import find_variants

        found = find_variants()
        specs, errors = [s for s, _ in found.specs], found.errors
    else:
        specs, errors = load_specs(root)
    reports: list[CompileReport] = []
    for e in errors:
        if only is None or e.variant in only:
            reports.append(CompileReport(e.variant or Path(e.path).parent.name, "", "-",
                                         ok=False, message=str(e)))
    if only is not None:
        specs = [s for s in specs if s.name in only]
    # Largest sources first, so the slowest compiles do not start last.
    work = sorted(((s, a) for s in specs for a in archs),
                  key=lambda sa: -sum(len(t) for _, t in sa[0].source_texts))
    jobs = jobs or max(1, min(len(work), os.cpu_count() or 1))
    lock = threading.Lock()

    def one(sa: tuple[VariantSpec, str]) -> list[CompileReport]:
        t0 = time.monotonic()
        out = compile_spec_nvcc(sa[0], sa[1], timeout_s)
        if on_report is not None:
            with lock:
                on_report(out, time.monotonic() - t0)
        return out

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(one, work))
    for r in results:
        reports.extend(r)
    return reports


def report_line(reports: Sequence[CompileReport], seconds: float) -> str:
    """One line for one (variant, arch) build: entries, worst registers, spills, time."""
    first = reports[0]
    if any(not r.ok for r in reports):
        msg = next(r.message for r in reports if not r.ok).strip().splitlines()
        return f"FAILED {first.variant} {first.arch}: {msg[0][:200] if msg else 'failed'}"
    if all(r.registers is None for r in reports):
        return f"{first.variant} {first.arch}: {first.message or 'skipped'}"
    regs = max(r.registers or 0 for r in reports)
    spills = sum(r.spills for r in reports)
    serialized = sum(r.wgmma_serialized for r in reports)
    return (f"compiled {first.variant} {first.arch}: {len(reports)} entr"
            f"{'y' if len(reports) == 1 else 'ies'}, up to {regs} registers, "
            f"{'no spills' if not spills else f'{spills} bytes of SPILLS'}"
            f"{f', WGMMA SERIALIZED in {serialized}' if serialized else ''} "
            f"({'cached' if all(r.cached for r in reports) else f'{seconds:.1f} s'})")
