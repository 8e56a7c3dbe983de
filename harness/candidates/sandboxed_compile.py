"""Compiling untrusted CUDA source (submissions) with nvcc inside `harness.candidates.sandbox`.

The worker does not hand a submission's source to NVRTC inside its own process (NVRTC
resolves `#include` against the worker's file system); it builds a cubin with nvcc in the
sandbox for the device's exact arch and loads that (`compile_cupy_sandboxed`). Validation
uses the same build (`compile_spec_sandboxed`), so what was checked is what runs.

Compiler output comes back with the sandbox's paths (/src/NAME); callers that show it to
anyone filter it first (`harness.submissions.diagnostics`).
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from harness.candidates import sandbox
from harness.candidates.compile import (
    CXX_STD,
    CompiledVariant,
    CompileError,
    CompileReport,
    KernelResources,
    NvccResult,
    _cupy,
    arch_flags,
    build_key,
    cubin_cache_dir,
    nvcc_path,
    nvcc_version,
    nvrtc_arch,
    parse_ptxas,
    spec_reports,
    write_atomic,
)
from harness.candidates.variants import VariantSpec

_cache: dict[str, CompiledVariant] = {}
_lock = threading.Lock()


def limits_for(timeout_s: float) -> sandbox.Limits:
    return sandbox.Limits(wall_s=timeout_s, cpu_s=max(1, int(timeout_s)))


def nvcc_cubin(source: str, options: Sequence[str] = (), timeout_s: float = 180.0, *,
               arch: str = "sm_90", filename: str = "variant.cu",
               require_isolation: bool = False) -> tuple[NvccResult, sandbox.SandboxResult]:
    """`nvcc -cubin -Xptxas -v` of `source` in the sandbox; the cubin comes back in
    `NvccResult.cubin`. No GPU needed."""
    nvcc = nvcc_path()
    if nvcc is None:
        res = sandbox.SandboxResult(127, "nvcc not found on PATH", "none", 0.0)
        return NvccResult(False, arch, res.output), res
    tool = sandbox.toolchain_root(nvcc)
    argv = [str(tool / "bin" / "nvcc"), "-cubin", *arch_flags(arch), "-Xptxas", "-v", CXX_STD,
            *options, "-o", "/out/out.cubin", f"/src/{filename}"]
    res = sandbox.run(argv, sources={filename: source}, toolchain=tool,
                      limits=limits_for(timeout_s), require_isolation=require_isolation)
    output = res.output.replace(f"/src/{filename}", filename)
    if res.timed_out or res.killed_by:
        why = res.killed_by or "wall clock"
        return NvccResult(False, arch, f"nvcc stopped: over the {why} limit",
                          timed_out=res.timed_out), res
    if res.returncode != 0 or "out.cubin" not in res.files:
        errors = [ln for ln in output.splitlines() if not ln.startswith("ptxas info")]
        return NvccResult(False, arch, "\n".join(errors).strip()
                          or f"nvcc exited with {res.returncode}"), res
    return NvccResult(True, arch, output, parse_ptxas(output), res.files["out.cubin"]), res


def compile_spec_sandboxed(spec: VariantSpec, target: str, timeout_s: float = 180.0, *,
                           require_isolation: bool = True) -> list[CompileReport]:
    """`compile_spec_nvcc` in the sandbox: one report per entry, or one failed report."""
    return spec_reports(spec, target, lambda arch: nvcc_cubin(
        spec.full_source(), spec.compile_options, timeout_s, arch=arch,
        filename=f"{spec.name}.cu", require_isolation=require_isolation)[0])


def _key(spec: VariantSpec, arch: str) -> str:
    return build_key("sandboxed", nvcc_version(), f"-arch={arch}", CXX_STD,
                     *spec.compile_options, spec.full_source())


def build_cubin(spec: VariantSpec, cc: tuple[int, int], timeout_s: float = 300.0) -> bytes:
    """The cubin of `spec` for `cc`, from the disk cache (keyed by the SHA-256 of source,
    options, arch and nvcc's version, so one submission cannot stand in for another) or built in the
    sandbox. Processes that run the same build (the sanitizer's tools) share it."""
    arch = nvrtc_arch(spec, cc)
    path = cubin_cache_dir() / f"{_key(spec, arch)}.cubin"
    if path.is_file():
        return path.read_bytes()
    res, _ = nvcc_cubin(spec.full_source(), spec.compile_options, timeout_s, arch=arch,
                        filename=f"{spec.name}.cu")
    if not res.ok or res.cubin is None:
        raise CompileError(f"{spec.name}: compilation failed for {arch}:\n{res.message}")
    write_atomic(path, res.cubin)
    return res.cubin


def compile_cupy_sandboxed(spec: VariantSpec, cc: tuple[int, int],
                           timeout_s: float = 300.0) -> CompiledVariant:
    """Build `spec` for compute capability `cc` with nvcc in the sandbox (`build_cubin`)
    and load the cubin with CuPy; cached in-process by source, options and arch."""
    arch = nvrtc_arch(spec, cc)
    options = (f"-arch={arch}", CXX_STD, *spec.compile_options)
    key = _key(spec, arch)
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    cubin = build_cubin(spec, cc, timeout_s)
    cp = _cupy()
    fd, path = tempfile.mkstemp(prefix="fa-cubin-", suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(cubin)
        module = cp.RawModule(path=path)
        functions = {e: module.get_function(e) for e in spec.entry_names()}
        compiled = CompiledVariant(key, arch, options, module, functions)
        # Reading the attributes loads the module (CuPy loads lazily): before the file goes.
        for e, f in functions.items():
            compiled.resources[e] = KernelResources(
                registers=int(f.num_regs), shared_bytes=int(f.shared_size_bytes),
                local_bytes=int(f.local_size_bytes), max_threads=int(f.max_threads_per_block))
    except Exception as e:  # noqa: BLE001 - a load failure is the submission's compile error
        raise CompileError(f"{spec.name}: loading the cubin failed for {arch}: {e}") from None
    finally:
        Path(path).unlink(missing_ok=True)
    with _lock:
        _cache[key] = compiled
    return compiled
