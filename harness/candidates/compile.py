"""Compiling kernel variants: CuPy/NVRTC on a GPU machine, nvcc anywhere.

Two paths, one source text (`VariantSpec.full_source()`: header inlined, `#line`
directives, FA_CHECK_ENTRY per entry):

* `compile_cupy(spec, cc)` builds a `cupy.RawModule` for the device's compute capability,
  cached in-process (dict keyed on source + options + arch) and on disk by CuPy
  (CUPY_CACHE_DIR). Resources per entry come from the loaded functions.
* `compile_all_nvcc(archs)` runs `nvcc -cubin -Xptxas -v` for every variant and arch on a
  machine without a GPU (CI), and parses registers, spills, shared memory and stack per
  entry from ptxas' report. `compile_with_timeout` is the same for one source string
  (submissions).

cupy is imported lazily: the CPU path never touches it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.candidates.variants import ARCH_RE, VariantSpec, load_specs

NVCC_TIMEOUT_S = 300.0
CXX_STD = "-std=c++17"
DEFAULT_DYNAMIC_SMEM_LIMIT = 48 * 1024  # above this a kernel must opt in


class CompileError(RuntimeError):
    """The compiler rejected a source; the message carries its output (file(line): ...)."""


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
    ok: bool = True
    message: str = ""

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


@dataclass
class EntryResources:
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0


def parse_ptxas(text: str) -> dict[str, EntryResources]:
    """Per entry function: registers, spills, static smem, stack from `-Xptxas -v`."""
    out: dict[str, EntryResources] = {}
    current: str | None = None
    props_for: str | None = None
    for line in text.splitlines():
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


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


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
        cmd = [nvcc, "-cubin", f"-arch={arch}", "-Xptxas", "-v", CXX_STD, *options,
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
    return target


def compile_spec_nvcc(spec: VariantSpec, target: str,
                      timeout_s: float = NVCC_TIMEOUT_S) -> list[CompileReport]:
    return spec_reports(spec, target, lambda arch: compile_with_timeout(
        spec.full_source(), spec.compile_options, timeout_s, arch=arch,
        filename=f"{spec.name}.cu"))


def spec_reports(spec: VariantSpec, target: str,
                 build: Callable[[str], NvccResult]) -> list[CompileReport]:
    """One report per entry of `spec` from `build(arch)` (an nvcc run, here or in the
    sandbox), one failed report when the build fails, or one skipped report when the
    variant needs a newer GPU than `target`."""
    arch = arch_for(spec, target)
    if arch is None:
        need = ".".join(map(str, spec.min_compute_capability))
        return [CompileReport(spec.name, "", target, ok=True,
                              message=f"skipped: needs compute capability {need}")]
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
        reports.append(CompileReport(
            spec.name, entry, arch, registers=r.registers, spill_stores=r.spill_stores,
            spill_loads=r.spill_loads, shared_bytes=r.shared_bytes, stack_bytes=r.stack_bytes,
            ok=True, message="" if r.spill_stores + r.spill_loads == 0 else "register spills"))
    return reports


def compile_all_nvcc(archs: Sequence[str] = ("sm_80", "sm_90"), root: Path | str | None = None,
                     *, timeout_s: float = NVCC_TIMEOUT_S, jobs: int | None = None,
                     only: Sequence[str] | None = None) -> list[CompileReport]:
    """Compile every variant under `root` (default: every discovered kernel folder,
    harness.candidates.discovery) for every arch with nvcc. A variant whose manifest does
    not load gets one failed report carrying the load error."""
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
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda sa: compile_spec_nvcc(sa[0], sa[1], timeout_s), work))
    for r in results:
        reports.extend(r)
    return reports


# ------------------------------------------------------------------------------------
# CuPy / NVRTC (GPU machine)
# ------------------------------------------------------------------------------------

_cache: dict[str, CompiledVariant] = {}
_cache_lock = threading.Lock()


def _cupy():
    # CuPy reads CUPY_CACHE_DIR at import: give the harness its own persistent cache
    # unless the user chose one.
    os.environ.setdefault("CUPY_CACHE_DIR",
                          str(Path.home() / ".cache" / "fa-harness" / "cupy"))
    import cupy

    return cupy


@dataclass
class KernelResources:
    registers: int
    shared_bytes: int  # static
    local_bytes: int  # spills and local arrays
    max_threads: int


@dataclass
class CompiledVariant:
    key: str
    arch: str
    options: tuple[str, ...]
    module: Any  # cupy.RawModule
    functions: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, KernelResources] = field(default_factory=dict)
    _smem_opt_in: dict[str, int] = field(default_factory=dict)

    def function(self, entry: str) -> Any:
        return self.functions[entry]

    def ensure_dynamic_smem(self, entry: str, nbytes: int) -> None:
        """Opt the kernel in to `nbytes` of dynamic shared memory when that exceeds 48 KB
        (the default limit); set once per size."""
        if nbytes <= DEFAULT_DYNAMIC_SMEM_LIMIT or self._smem_opt_in.get(entry, 0) >= nbytes:
            return
        self.functions[entry].max_dynamic_shared_size_bytes = nbytes
        self._smem_opt_in[entry] = nbytes

    def resources_dict(self) -> dict[str, dict[str, int]]:
        return {e: dict(r.__dict__) for e, r in self.resources.items()}


def nvrtc_arch(spec: VariantSpec, cc: tuple[int, int]) -> str:
    target = f"sm_{cc[0]}{cc[1]}"
    arch = arch_for(spec, target)
    if arch is None:
        need = ".".join(map(str, spec.min_compute_capability))
        raise CompileError(f"{spec.name} needs compute capability {need}, device has "
                           f"{cc[0]}.{cc[1]}")
    return arch


def compile_cupy(spec: VariantSpec, cc: tuple[int, int]) -> CompiledVariant:
    """Compile (or fetch from cache) `spec` for a device of compute capability `cc`."""
    arch = nvrtc_arch(spec, cc)
    source = spec.full_source()
    options = (f"-arch={arch}", CXX_STD, *spec.compile_options)
    key = hashlib.sha256("\0".join((source, *options)).encode()).hexdigest()
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    cp = _cupy()
    try:
        module = cp.RawModule(code=source, options=options)
        functions = {e: module.get_function(e) for e in spec.entry_names()}
    except Exception as e:  # CompileException carries NVRTC's log
        raise CompileError(f"{spec.name}: compilation failed for {arch}:\n{e}") from None
    compiled = CompiledVariant(key, arch, options, module, functions)
    for e, f in functions.items():
        compiled.resources[e] = KernelResources(
            registers=int(f.num_regs), shared_bytes=int(f.shared_size_bytes),
            local_bytes=int(f.local_size_bytes), max_threads=int(f.max_threads_per_block))
    with _cache_lock:
        _cache[key] = compiled
    return compiled
