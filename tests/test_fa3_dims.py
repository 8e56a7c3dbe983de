"""fa3_wgmma's forward at d = 192, 256 and d_qk = 192 / d_v = 128 (declared since they
passed on a GPU), and on e4m3 Q, K, V at d = 64 and 128 (built, declared only the way a
GPU run declares them: bench/declare_fa3.sh on a copy of the folder). Every case of the
larger head dims runs exactly one launch whose tensor maps' boxes match the kernel's tiles
and whose shared memory fits the H100's 227 KB, the other cases plan as they do without
the e4m3 declaration, and the backward stays at d = 64 and 128. No GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from harness.candidates.cuda_candidate import CudaVariant
from harness.candidates.tensor_map import Box
from harness.candidates.variant_spec import size_env
from harness.candidates.variants import KERNELS_ROOT, load_variant_dir
from harness.core.cases import Case, MaskKind
from harness.core.grids import get_grid

ROOT = Path(__file__).resolve().parents[1]
M = MaskKind
SMEM_OPTIN = 227 * 1024
# (d_qk, d_v) -> the kernel's K/V tile, its launch and whether the cases run it
# (fa3_wgmma.cu's entries).
TILES = {(192, 192): 112, (256, 256): 64, (192, 128): 128}


@pytest.fixture(scope="module")
def declared(tmp_path_factory) -> CudaVariant:
    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(KERNELS_ROOT / "fa3_wgmma", root / "harness" / "kernels" / "fa3_wgmma")
    shutil.copytree(KERNELS_ROOT / "include", root / "harness" / "kernels" / "include")
    out = subprocess.run(["bash", str(ROOT / "bench" / "declare_fa3.sh"), str(root), "fp8"],
                         capture_output=True, text=True, check=True)
    assert "declared" in out.stdout
    spec = load_variant_dir(root / "harness" / "kernels" / "fa3_wgmma")
    return CudaVariant.from_spec(spec)


def _launches(cand: CudaVariant, case: Case) -> list:
    return [p for p in cand.plan(case, num_splits=1, sm_count=132) if not p.skipped]


def test_shipped_the_larger_head_dims_run_and_e4m3_is_skipped_with_the_reason():
    cand = CudaVariant.from_spec(load_variant_dir(KERNELS_ROOT / "fa3_wgmma"))
    assert cand.supports(Case(1, 2, 2, 64, 64, 256)) is None
    assert cand.supports(Case(1, 2, 2, 64, 64, 192, head_dim_v=128)) is None
    assert "fp8 q/k/v not supported" in cand.supports(
        Case.from_id("b1h2-64x64-d128-bf16-none-fp8_qkv_head"))
    with pytest.raises(subprocess.CalledProcessError):   # no longer a word to declare
        subprocess.run(["bash", str(ROOT / "bench" / "declare_fa3.sh"), "/nonexistent", "dims"],
                       capture_output=True, check=True)


def test_declared_each_larger_case_runs_one_launch_of_its_tiles(declared):
    spec = declared.spec
    cases = [c for c in get_grid("perf-dims") + get_grid("mods")
             if c.head_dim > 128 and declared.supports(c) is None]
    assert {(c.head_dim, c.dv) for c in cases} == set(TILES)
    for case in cases:
        plans = _launches(declared, case)
        assert len(plans) == 1, (case.id, plans)
        p = plans[0]
        mods = "m" if case.has_score_mods else ""
        if case.dv != case.head_dim:
            assert p.entry.endswith(f"_fwdv{mods}_{p.entry.split('_')[-2]}_d192v128"), p.entry
        else:
            assert p.entry.startswith(f"fa3_wgmma_fwd{mods}_"), p.entry
            assert p.entry.endswith(f"_d{case.head_dim}"), p.entry
        assert p.block == (384, 1, 1) and 0 < p.grid[0] <= 132
        assert p.shared_mem <= SMEM_OPTIN, (case.id, p.shared_mem)
        env = size_env(case, tiles=spec.tiles)
        boxes = {m.tensor: m.box_rows.evaluate(env) for m in spec.tensor_maps}
        assert boxes == {"q": 128, "k": TILES[(case.head_dim, case.dv)],
                         "v": TILES[(case.head_dim, case.dv)]}, case.id
        # Q tile + 2 slots of K and V + 3 KB (barriers, slots, a word per consumer,
        # alignment), as the kernel lays them out
        bn = TILES[(case.head_dim, case.dv)]
        assert p.shared_mem == 128 * case.head_dim * 2 + 2 * bn * (case.head_dim + case.dv) * 2 + 3072


def test_declared_the_other_pairs_and_the_backward_stay_out(declared):
    assert "d_qk/d_v 128/192 not supported" in declared.supports(
        Case(1, 2, 2, 64, 64, 128, head_dim_v=192))
    assert "d_qk/d_v 256/192" in declared.supports(Case(1, 2, 2, 64, 64, 256, head_dim_v=192))
    reason = declared.support.reason_unsupported_backward(Case(1, 2, 2, 64, 64, 256))
    assert reason == "its backward does not support head_dim 256 (declares backward head dims 64, 128)"
    names = declared.spec.entry_names()
    assert "fa3_wgmma_fwd_bf16_d256" in names and "fa3_wgmma_fwdvm_fp16_d192v128" in names
    assert not any("bwd" in n and ("d192" in n or "d256" in n) for n in names)


def test_declared_the_d64_d128_cases_plan_as_undeclared(declared):
    plain = CudaVariant.from_spec(load_variant_dir(KERNELS_ROOT / "fa3_wgmma"))
    cases = [c for c in get_grid("perf") + get_grid("mods") + get_grid("smoke")
             if plain.supports(c) is None]
    assert len(cases) > 60
    for case in cases:
        assert declared.supports(case) is None
        assert _launches(declared, case) == _launches(plain, case), case.id


def test_declared_fp8_cases_run_the_e4m3_entries(declared):
    fp8 = [c for c in get_grid("mods") if c.fp8.quantizes_q]
    ran = [c for c in fp8 if declared.supports(c) is None]
    assert {c.head_dim for c in ran} == {64, 128}
    assert any(c.has_score_mods for c in ran) and any(not c.has_score_mods for c in ran)
    assert [c.mask for c in fp8 if c not in ran] == [M.RANDOM]
    assert declared.supports(Case.from_id("b1h2-64x64-d256-bf16-none-fp8_qkv_head")) == (
        "fp8 q/k/v not supported at head_dim 256 (declares fp8 at 64, 128)")
    for case in ran + [Case.from_id("b1h16-16384x16384-d128-bf16-causal_br-fp8_qkv_head")]:
        d = case.head_dim
        (p,) = _launches(declared, case)
        mods = "m" if case.has_score_mods else ""
        assert p.entry == f"fa3_wgmma_fwd8{mods}_{case.id.split('-')[3]}_d{d}"
        # Q tile + 3 x (K, V staging, V^T) of 128 rows of d bytes + 3 KB
        assert p.shared_mem == 128 * d + 3 * 3 * 128 * d + 3072 <= SMEM_OPTIN
        boxes = dict(declared.tensor_map_boxes(case, num_splits=1, sm_count=132))
        # rows of d bytes; Q and K in the swizzle of that width, V's staging unswizzled
        # at d = 64 (the transposers read it)
        assert boxes == {"q": Box(128, d, d), "k": Box(128, d, d),
                         "v": Box(128, d, 128 if d == 128 else 0)}, case.id
        for box in boxes.values():
            box.check(1)


def test_the_timing_buffers_of_a_dv_case_are_dv_wide(declared):
    """The buffers the timing path hands a kernel (perf.output_buffers) pass the launch's
    own shape checks for every perf-dims case: a d_v case's O is d_v wide there too, as in
    the check (the first GPU timing of d_qk = 192 / d_v = 128 stopped at a 192-wide O)."""
    from harness.candidates.params import build_params
    from harness.core.cases import make_inputs
    from harness.measure.perf import output_buffers

    case = Case(1, 2, 2, 128, 128, 192, "bfloat16", M.NONE, head_dim_v=128)
    out, lse = output_buffers(declared, case, "cpu")
    assert out.shape == (1, 2, 128, 128) and lse.shape == (1, 2, 128)
    build_params(case, make_inputs(case, "cpu"), out, lse, [], 1)
