"""nvcc compilation of every variant (no GPU needed): resources, spills, compile errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.candidates.compile import (
    CompileReport,
    arch_for,
    compile_all_nvcc,
    compile_with_timeout,
    format_reports,
    nvcc_path,
    parse_ptxas,
)
from harness.candidates.nvcc import report_line
from harness.candidates.variants import KERNELS_ROOT, load_specs, load_variant_dir

DATA = Path(__file__).parent / "data" / "bad_variants"
ARCHS = ("sm_80", "sm_90")
needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc not on PATH")

PTXAS_SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'bar' for 'sm_90'
ptxas info    : Function properties for bar
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers
ptxas info    : Compile time = 9.457 ms
ptxas info    : Function properties for _Z6helperv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'foo' for 'sm_90'
ptxas info    : Function properties for foo
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
"""


def test_parse_ptxas():
    res = parse_ptxas(PTXAS_SAMPLE)
    assert set(res) == {"bar", "foo"}
    bar, foo = res["bar"], res["foo"]
    assert (bar.registers, bar.spill_stores, bar.spill_loads, bar.stack_bytes,
            bar.shared_bytes) == (255, 8, 12, 16, 0)
    assert (foo.registers, foo.spill_stores, foo.shared_bytes) == (12, 0, 1024)


# ptxas prints its C7511 warning before the report of the function it names (CUDA 13.0).
PTXAS_SERIALIZED = """\
ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the wgmma pipeline in the function 'slow'
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'slow' for 'sm_90a'
ptxas info    : Function properties for slow
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 3 barriers
ptxas info    : Compiling entry function 'fast' for 'sm_90a'
ptxas info    : Function properties for fast
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 3 barriers
"""


def test_parse_ptxas_sees_serialized_wgmma():
    res = parse_ptxas(PTXAS_SERIALIZED)
    assert set(res) == {"slow", "fast"}
    assert res["slow"].wgmma_serialized and not res["fast"].wgmma_serialized
    # Another of ptxas' reasons, worded "for the function" (C7512, seen with CUDA 13.0).
    c7512 = PTXAS_SERIALIZED.replace(
        "(C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized due "
        "to insufficient register resources for the wgmma pipeline in the function 'slow'",
        "(C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due "
        "to insufficient register resources for the function 'slow'")
    assert "C7511" not in c7512
    other = parse_ptxas(c7512)
    assert other["slow"].wgmma_serialized and not other["fast"].wgmma_serialized
    assert res["slow"].registers == 168   # the rest of its report still parsed
    assert not any(r.wgmma_serialized for r in parse_ptxas(PTXAS_SAMPLE).values())
    slow = CompileReport("v", "slow", "sm_90a", 168, 0, 0, 0, 0, wgmma_serialized=True)
    fast = CompileReport("v", "fast", "sm_90a", 168, 0, 0, 0, 0)
    assert "WGMMA SERIALIZED" in format_reports([slow, fast])
    assert report_line([slow, fast], 1.0).endswith("no spills, WGMMA SERIALIZED in 1 (1.0 s)")
    assert "SERIALIZED" not in report_line([fast], 1.0)


def test_format_reports():
    text = format_reports([
        CompileReport("fa2_simt", "fa2_simt_fwd_fp16_d64", "sm_90", 168, 0, 0, 0, 0),
        CompileReport("spilly", "k", "sm_80", 255, 8, 8, 0, 16, message="register spills"),
        CompileReport("late", "", "sm_80", ok=True, message="skipped: needs compute capability 9.0"),
        CompileReport("broken", "", "sm_90", ok=False, message="broken/k.cu(3): error: boom"),
    ])
    lines = text.splitlines()
    assert "regs" in lines[0]
    assert any("fa2_simt_fwd_fp16_d64" in ln and ln.rstrip().endswith("ok") for ln in lines)
    assert any(ln.startswith("spilly") and "SPILLS" in ln and "8/8" in ln for ln in lines)
    assert any("skipped: needs compute capability 9.0" in ln for ln in lines)
    assert "broken (sm_90): broken/k.cu(3): error: boom" in text


def test_arch_for():
    spec = load_variant_dir(KERNELS_ROOT / "template")
    assert arch_for(spec, "sm_80") == "sm_80" and arch_for(spec, "sm_90") == "sm_90"
    hopper = spec.__class__(**{**spec.__dict__, "arch": "sm_90a",
                               "min_compute_capability": (9, 0)})
    assert arch_for(hopper, "sm_80") is None
    assert arch_for(hopper, "sm_90") == "sm_90a"
    # Arch-specific code (wgmma, setmaxnreg) exists on that chip only: skipped elsewhere.
    assert arch_for(hopper, "sm_100") is None


# ------------------------------------------------------------------ real compilations

@pytest.fixture(scope="module")
def shipped_reports() -> list[CompileReport]:
    return compile_all_nvcc(ARCHS)


@pytest.mark.nvcc
@needs_nvcc
def test_every_shipped_variant_compiles_without_spills(shipped_reports):
    specs, errors = load_specs()
    assert errors == []
    failed = [r for r in shipped_reports if not r.ok]
    assert failed == [], format_reports(failed)
    for spec in specs:
        for arch in ARCHS:
            got = [r for r in shipped_reports if r.variant == spec.name and r.arch.startswith(arch)]
            if arch_for(spec, arch) is None:
                assert got and got[0].message.startswith("skipped")
                continue
            assert sorted(r.entry for r in got) == sorted(spec.entry_names()), (spec.name, arch)
            for r in got:
                assert r.registers is not None and 0 < r.registers <= 255
                assert r.spills == 0, f"{r.variant} {r.entry} {r.arch} spills: {r}"
                assert r.stack_bytes == 0, f"{r.variant} {r.entry} {r.arch} uses a stack"


@pytest.mark.nvcc
@needs_nvcc
def test_bad_variants_compile_reports():
    reports = {r.variant: r for r in compile_all_nvcc(("sm_80",), root=DATA)}
    # loader errors become failed reports carrying the file and field
    assert not reports["missing_field"].ok
    assert "manifest.toml: algorithm: missing required field" in reports["missing_field"].message
    assert "launch[0].grid[0]" in reports["unknown_size"].message
    # compiler errors carry file(line) of the original source
    r = reports["does_not_compile"]
    assert not r.ok and "does_not_compile/kernel.cu(6): error" in r.message
    r = reports["missing_entry"]
    assert not r.ok and 'identifier "missing_entry_fwd_fp16" is undefined' in r.message
    r = reports["wrong_signature"]
    assert not r.ok
    assert ("entry point 'wrong_signature_fp16' must be: extern \"C\" __global__ void "
            "wrong_signature_fp16(FaParams p)") in r.message


@pytest.mark.nvcc
@needs_nvcc
def test_compile_with_timeout():
    src = '#include <cstdint>\nextern "C" __global__ void k(int* x) { x[threadIdx.x] = 1; }\n'
    ok = compile_with_timeout(src, (), timeout_s=120, arch="sm_80", keep_cubin=True)
    assert ok.ok and "k" in ok.resources and ok.cubin
    slow = compile_with_timeout(src, (), timeout_s=0.01, arch="sm_80")
    assert not slow.ok and slow.timed_out and "timed out" in slow.message
    bad = compile_with_timeout("this is not C++\n", (), timeout_s=120, filename="sub.cu")
    assert not bad.ok and "sub.cu(1)" in bad.message


@pytest.mark.nvcc
@needs_nvcc
def test_kernels_compile_prints_each_build_as_it_lands_and_caches_it(tmp_path):
    """`kernels --compile` printed nothing until every build was done; now a line per
    (variant, arch) as it lands, before the table, and an unchanged source is not
    compiled again (the cubin cache: source, options, arch, nvcc's version)."""
    import os
    import subprocess
    import sys

    from harness.paths import CACHE_VARIABLES

    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    env.update(FA_HARNESS_CACHE=str(tmp_path / "cache"), COLUMNS="80")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    cmd = [sys.executable, "-m", "harness", "kernels", "--compile", "--arch", "sm_80"]

    def run() -> list[str]:
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc.stdout.splitlines()

    first = run()
    table = next(i for i, ln in enumerate(first) if ln.startswith("variant "))
    built = [i for i, ln in enumerate(first) if ln.startswith("compiled ")]
    assert len(built) >= 6 and max(built) < table  # every build line before the table
    assert any(ln.startswith("compiled fa2_mma sm_80: ") and "no spills" in ln for ln in first)
    assert not any("(cached)" in ln for ln in first)
    again = run()
    assert all(ln.endswith("(cached)") for ln in again if ln.startswith("compiled "))
    assert list((tmp_path / "cache" / "cubin").glob("*.cubin"))
