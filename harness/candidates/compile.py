"""Compiling kernel variants: CuPy/NVRTC on a GPU machine, nvcc anywhere.

Two paths, one source text (`VariantSpec.full_source()`: header inlined, `#line`
directives, FA_CHECK_ENTRY per entry):

* `compile_cupy(spec, cc)` builds a `cupy.RawModule` for the device's compute capability,
  cached in-process (dict keyed on source + options + arch) and on disk by CuPy
  (CUPY_CACHE_DIR, under harness.paths.cache_dir()). Resources per entry come from the loaded functions.
* `compile_all_nvcc(archs)` runs `nvcc -cubin -Xptxas -v` for every variant and arch on a
  machine without a GPU (CI), and parses registers, spills, shared memory and stack per
  entry from ptxas' report (harness.candidates.nvcc, re-exported here).

cupy is imported lazily: the CPU path never touches it.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from harness.candidates.nvcc import (  # noqa: F401 - the nvcc half, re-exported
    CXX_STD,
    NVCC_TIMEOUT_S,
    CompileReport,
    EntryResources,
    NvccResult,
    arch_flags,
    arch_for,
    build_key,
    cached_nvcc,
    compile_all_nvcc,
    compile_spec_nvcc,
    compile_with_timeout,
    cubin_cache_dir,
    format_reports,
    nvcc_path,
    nvcc_version,
    parse_ptxas,
    spec_reports,
    unsupported_reason,
    write_atomic,
)
from harness.candidates.variants import VariantSpec

DEFAULT_DYNAMIC_SMEM_LIMIT = 48 * 1024  # above this a kernel must opt in


class CompileError(RuntimeError):
    """The compiler rejected a source; the message carries its output (file(line): ...)."""


# ------------------------------------------------------------------------------------
# CuPy / NVRTC (GPU machine)
# ------------------------------------------------------------------------------------

_cache: dict[str, CompiledVariant] = {}
_cache_lock = threading.Lock()


def _cupy():
    # CuPy reads CUPY_CACHE_DIR at import: the harness's persistent cache
    # (harness.paths) unless the user chose one.
    from harness.paths import use_compile_caches

    use_compile_caches()
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
        raise CompileError(f"{spec.name} {unsupported_reason(spec)}, device has "
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
