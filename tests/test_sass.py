"""The Hopper variant is on the fast path: warpgroup MMAs in its SASS, no local memory.

Runs wherever nvcc and cuobjdump exist (the dev extra brings cuobjdump as a wheel); no GPU.
"""

from __future__ import annotations

import re

import pytest

from harness.candidates.compile import arch_flags, arch_for, cached_nvcc, nvcc_path
from harness.candidates.nvcc import unsupported_reason
from harness.candidates.sass import count, cuobjdump_path, opcode_counts, sass_by_function
from harness.candidates.variants import KERNELS_ROOT, load_variant_dir

needs_tools = pytest.mark.skipif(nvcc_path() is None or cuobjdump_path() is None,
                                 reason="nvcc or cuobjdump not found")


def _build(variant: str, target: str = "sm_90"):
    """The variant's nvcc build (cubin and ptxas' report), through the cubin cache."""
    spec = load_variant_dir(KERNELS_ROOT / variant)
    arch = arch_for(spec, target)
    assert arch is not None
    res = cached_nvcc(spec.full_source(), spec.compile_options, 300.0, arch=arch,
                      filename=f"{variant}.cu")
    assert res.ok, res.message
    assert res.cubin is not None
    return spec, res


def _sass(variant: str, target: str = "sm_90") -> dict[str, str]:
    """Every kernel of the variant's module: its declared entries and those built ahead of
    their declaration (fa3_wgmma's d = 192 and 256), which must meet the same bar."""
    spec, res = _build(variant, target)
    return {name: text for name, text in sass_by_function(res.cubin).items()
            if name in spec.entry_names() or name.startswith(f"{variant}_")}


@needs_tools
def test_fa3_wgmma_keeps_its_wgmma_in_flight():
    # ptxas may serialize every wgmma of a function (warnings C7511, C7512, C7520) when it
    # cannot track their registers; the SASS still holds HGMMA, so the test below would not
    # see it. A restructure of the forward's last tile did this once and cost 25% on the H200.
    spec, res = _build("fa3_wgmma")
    assert set(spec.entry_names()) <= set(res.resources)
    serialized = sorted(n for n, r in res.resources.items() if r.wgmma_serialized)
    assert serialized == [], serialized
    # The same seen in the SASS, whatever ptxas says: a serialized wgmma is followed by its
    # own wait (WARPGROUP.DEPBAR); in flight, one wait retires a group of them.
    # (QGMMA: the e4m3 entries' 8-bit warpgroup MMA; at d = 64 their groups are the
    # smallest, an S of 2 k32 steps and a PV of 4, issued together: 6 MMAs per 2 waits.)
    for name, text in _sass("fa3_wgmma").items():
        ops = opcode_counts(text)
        waits = sum(n for op, n in ops.items() if op.startswith("WARPGROUP.DEPBAR"))
        mmas = count(text, "HGMMA") + count(text, "QGMMA")
        assert waits <= mmas // 3, (name, waits, mmas)


@needs_tools
def test_fa3_wgmma_softmax_runs_under_its_own_pv():
    # In the forward's loop a consumer issues S_j and P_{j-1} V_{j-1}, waits for S_j only
    # (DEPBAR.LE gsb0, 0x1), computes the softmax of S_j, and only then waits for the PV
    # (0x0). ptxas moved that second wait above the row max, so the exponentials ran after
    # the PV had retired instead of under it; at d = 128 the kernel's sink store keeps the
    # wait down (d = 64 gained nothing from it on the H200, and goes without; d = 192
    # and 256 keep it). Every exponential of the tile (keys / 2 per thread) lies between
    # the two waits.
    for name, text in _sass("fa3_wgmma").items():
        if "_fwd" not in name or name.endswith("d64"):
            continue
        keys = 128 if re.search(r"_fwd(c|8|m_\w+_d128)", name) else _fwd_tile(name)
        lines = [ln for ln in text.splitlines() if "WARPGROUP.DEPBAR" in ln or "MUFU.EX2" in ln]
        starts = [i for i, ln in enumerate(lines) if "DEPBAR.LE gsb0, 0x1" in ln]
        assert starts, (name, "no wait that leaves one wgmma group in flight")
        for i in starts:
            end = next(k for k in range(i + 1, len(lines)) if "DEPBAR" in lines[k])
            assert "gsb0, 0x0" in lines[end], (name, lines[end])
            exps = end - i - 1
            assert exps >= keys // 2, (name, f"{exps} MUFU.EX2 before the PV's wait")


def _fwd_tile(name: str) -> int:
    """The K/V tile (keys) of a forward entry by its head dims, but for the 128-key
    causal and modifiers' entries at d = 128 (fa3_wgmma.cu)."""
    tiles = {"d64": 128, "d128": 176, "d192": 112, "d256": 64, "d192v128": 128}
    return tiles[name.rsplit("_", 1)[1]]


def _longest_max_chain(text: str) -> int:
    """The longest run of FMNMX into one register that reads its own last value (a row
    max's dependency chain), any other write to the register ending the run."""
    run: dict[str, int] = {}
    best = 0
    for ln in text.splitlines():
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s+([^;]*);", ln)
        if not m:
            continue
        args = [a.strip() for a in m.group(2).split(",")]
        if not args or not re.fullmatch(r"R\d+", args[0]):
            continue
        dst = args[0]
        if m.group(1).startswith("FMNMX") and dst in args[1:3]:
            run[dst] = run.get(dst, 0) + 1
            best = max(best, run[dst])
        else:
            run[dst] = 0
    return best


@needs_tools
def test_fa3_wgmma_d64_row_max_runs_in_two_chains():
    # At d = 64 each thread's row max over a 128-key tile is 16 steps; in one chain each
    # step waits for the last (a "wait" stall per step), in two it is 8 and a combine
    # (1.018x over the 12 d = 64 perf shapes on an H100). d = 128 keeps one chain of 22
    # (no gain measured there); the check is that ptxas did not fold d = 64's back into one.
    for name, text in _sass("fa3_wgmma").items():
        if "_fwd_" not in name:
            continue
        longest = _longest_max_chain(text)
        if name.endswith("d64"):
            assert longest <= 10, (name, longest)
        elif name.endswith("d128"):
            assert longest >= 16, (name, longest, "the parser no longer sees the chain")


@needs_tools
def test_fa3_wgmma_runs_on_warpgroup_mma_without_local_memory():
    spec = load_variant_dir(KERNELS_ROOT / "fa3_wgmma")
    sass = _sass("fa3_wgmma")
    assert set(spec.entry_names()) <= set(sass)
    forward = {n: t for n, t in sass.items() if re.search(r"_fwd[cv]?_", n)}
    main = {n: t for n, t in sass.items() if "_bwd_main_" in n}
    # fp16/bf16 x d = 64/128/192/256, the 128-key causal entries at d = 128 and the
    # d_qk = 192 / d_v = 128 ones; the backward at d = 64/128
    assert len(forward) == 12 and len(main) == 4
    for name, text in sass.items():
        assert count(text, "LDL") == 0 and count(text, "STL") == 0, (name, "local memory")
        assert count(text, "HMMA") == 0, name
    for name, text in forward.items():
        ops = opcode_counts(text)
        d = int(re.search(r"_d(\d+)", name).group(1))
        # S = QK^T takes d_qk/16 k-steps of 16, PV at least 8 (a 128-key tile's 16-key
        # steps; a 64-key tile's 4 steps on each of 2 chunks of 128 columns at d = 256):
        # at least one S and one PV on warpgroup MMAs.
        assert count(text, "HGMMA") >= d // 16 + 8, (name, ops)
        assert count(text, "USETMAXREG") == 2, name   # producer gives, consumers take
        assert any(op.startswith("HGMMA.64x128x16.F32") for op in ops), name
    fp8 = {n: t for n, t in sass.items() if "_fwd8" in n}
    # fp16 / bf16 output, without and with the modifiers, at d = 64 and 128
    assert len(fp8) == 8
    for name, text in fp8.items():
        # S (k32 steps along d) and PV (4 k32 steps per 128-key tile, N = d) on 8-bit
        # warpgroup MMAs
        ops = opcode_counts(text)
        d = 128 if name.endswith("d128") else 64
        assert ops["QGMMA.64x128x32.F32.E4M3.E4M3"] >= d // 32, (name, ops)
        assert ops[f"QGMMA.64x{d}x32.F32.E4M3.E4M3"] >= 4, (name, ops)
        e4m3 = sum(n for op, n in ops.items() if op.startswith("F2FP.SATFINITE.E4M3"))
        assert e4m3 >= 16, (name, "P to e4m3 in registers")
        assert count(text, "USETMAXREG") == 2, name
    for name, text in main.items():
        ops = opcode_counts(text)
        d = 128 if name.endswith("d128") else 64
        bm = 8192 // d
        # Per step: S^T and dP^T (d/16 k-steps each), dV and dK (BM/16 each) and dQ.
        assert count(text, "HGMMA") >= 2 * (d // 16) + 2 * (bm // 16), (name, ops)
        assert "tnspA.tnspB" in text, (name, "dQ from dS^T and K")
        assert count(text, "UBLKRED") >= 1, (name, "dQ by bulk reduction")
        assert count(text, "UTMALDG") >= 1, (name, "tiles by TMA")
        assert count(text, "LDGSTS") == 0, (name, "no cp.async in flight at the fences")


@needs_tools
def test_the_counter_tells_mma_sync_from_wgmma():
    # fa2_mma is mma.sync: HMMA and no HGMMA. Without this the test above could pass on
    # a SASS reader that sees nothing.
    for name, text in _sass("fa2_mma").items():
        if "fwd" in name:
            assert count(text, "HMMA") > 0 and count(text, "HGMMA") == 0, name


def test_arch_specific_targets():
    spec = load_variant_dir(KERNELS_ROOT / "fa3_wgmma")
    assert spec.arch == "sm_90a"
    assert arch_for(spec, "sm_90") == "sm_90a"
    assert arch_for(spec, "sm_80") is None
    assert arch_for(spec, "sm_100") is None    # sm_90a code runs on Hopper only
    assert unsupported_reason(spec) == "needs sm_90a (arch-specific instructions)"
    assert arch_flags("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert arch_flags("sm_80") == ["-arch=sm_80"]
    fa2 = load_variant_dir(KERNELS_ROOT / "fa2_mma")
    assert arch_for(fa2, "sm_100") == "sm_100"


@needs_tools
def test_sass_same_tells_a_source_edit_that_keeps_the_code_from_one_that_changes_it(
        tmp_path, capsys):
    """bench/sass_same.py: a comment leaves the SASS as it was (the same kernel: what was
    measured of it holds); a changed line of arithmetic does not."""
    import shutil
    import sys

    sys.path.insert(0, str(KERNELS_ROOT.parents[1] / "bench"))
    import sass_same

    src = KERNELS_ROOT / "template"
    text = (src / "template.cu").read_text()
    copies = {}
    for name, edit in (("base", text),
                       ("comment", "// a comment, nothing else\n" + text),
                       ("changed", text.replace("l = l * alpha + pj;", "l = l * alpha + 2.f * pj;"))):
        d = tmp_path / name / "template"
        shutil.copytree(src, d)
        (d / "template.cu").write_text(edit)
        copies[name] = sass_same.entries_at(".", str(d), "sm_80", tmp_path / "git")
    assert "l = l * alpha + pj;" in text  # the line the third copy changes
    assert copies["base"] and copies["base"] == copies["comment"]
    assert copies["base"] != copies["changed"]
    assert set(copies["base"]) == set(copies["changed"])
