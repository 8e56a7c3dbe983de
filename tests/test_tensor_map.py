"""`[[tensor_map]]` tables: parsed field by field, bad input one message naming the field,
the boxes planned per case and checked against TMA's rules before anything launches, and
the FaParams slot that carries the descriptors. Encoding needs a driver (GPU tests)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.candidates.cuda_candidate import CudaVariant
from harness.candidates.params import build_params, field_offsets
from harness.candidates.tensor_map import Box, TensorMapError, encode
from harness.candidates.variants import KERNELS_ROOT, VariantError, load_variant_dir
from harness.core.cases import Case, MaskKind, make_inputs

HEAD = """name = "v"
description = "test variant"
algorithm = "fa2"
sources = ["v.cu"]
min_compute_capability = "9.0"
arch = "sm_90a"

[supports]
dtypes = ["float16"]
head_dims = [64, 128]
masks = ["none"]
gqa = true
writes_lse = true

[tiles]
block_q = 128
block_k = 128

[[launch]]
entry = "v_fwd_{dtype}"
grid = ["ceil_div(seqlen_q, block_q)", "heads", "batch"]
block = [384, 1, 1]
"""

MAPS = """
[[tensor_map]]
tensor = "k"
box_rows = "block_k"
box_cols = "head_dim // 2"
swizzle = 128
"""

KERNEL = '#include "fa_harness.h"\nextern "C" __global__ void v_fwd_fp16(FaParams p) {}\n'


def _variant(root: Path, manifest: str) -> Path:
    d = root / "v"
    d.mkdir(parents=True, exist_ok=True)
    (d / "manifest.toml").write_text(manifest)
    (d / "v.cu").write_text(KERNEL)
    return d


def test_tables_are_parsed_and_boxes_planned_per_case(tmp_path):
    spec = load_variant_dir(_variant(tmp_path, HEAD + MAPS))
    (m,) = spec.tensor_maps
    assert (m.tensor, m.swizzle.text) == ("k", "128")
    v = CudaVariant.from_spec(spec)
    case = Case(2, 4, 4, 256, 256, 128, "float16", MaskKind.NONE)
    assert v.tensor_map_boxes(case, num_splits=1, sm_count=132) == [("k", Box(128, 64, 128))]
    small = Case(2, 4, 4, 256, 256, 64, "float16", MaskKind.NONE)
    assert v.tensor_map_boxes(small, num_splits=1, sm_count=132) == [("k", Box(128, 32, 128))]


def test_a_swizzle_may_follow_the_case(tmp_path):
    # e4m3 rows of 64 bytes take the 64-byte swizzle, 2-byte ones of 128 the 128-byte one;
    # a value TMA has no mode for is refused when a case gives it (the launch's check)
    table = MAPS.replace("swizzle = 128", 'swizzle = "128 - 64 * (head_dim == 64)"')
    v = CudaVariant.from_spec(load_variant_dir(_variant(tmp_path, HEAD + table)))
    small = Case(2, 4, 4, 256, 256, 64, "float16", MaskKind.NONE)
    assert v.tensor_map_boxes(small, num_splits=1, sm_count=132) == [("k", Box(128, 32, 64))]
    bad = MAPS.replace("swizzle = 128", 'swizzle = "head_dim - 16"')
    v = CudaVariant.from_spec(load_variant_dir(_variant(tmp_path / "b", HEAD + bad)))
    ((_, box),) = v.tensor_map_boxes(small, num_splits=1, sm_count=132)
    with pytest.raises(TensorMapError, match="swizzle 48"):
        box.check(2)


def test_no_tables_means_no_maps(tmp_path):
    spec = load_variant_dir(_variant(tmp_path, HEAD))
    assert spec.tensor_maps == ()
    case = Case(1, 1, 1, 64, 64, 64, "float16", MaskKind.NONE)
    assert CudaVariant.from_spec(spec).tensor_map_boxes(case, num_splits=1, sm_count=132) == []


@pytest.mark.parametrize("table, fragment", [
    (MAPS.replace('tensor = "k"', 'tensor = "lse"'), "tensor_map[0].tensor"),
    (MAPS.replace("swizzle = 128", "swizzle = 256"), "tensor_map[0].swizzle"),
    (MAPS.replace("swizzle = 128", 'swizzle = "128 +"'), "tensor_map[0].swizzle"),
    (MAPS.replace("swizzle = 128", 'swizzle = "seqlen"'), "tensor_map[0].swizzle"),
    (MAPS.replace('box_rows = "block_k"', 'box_rows = "__import__(\'os\')"'),
     "tensor_map[0].box_rows"),
    (MAPS.replace('box_cols = "head_dim // 2"\n', ""), "tensor_map[0].box_cols"),
    (MAPS + 'stride = 3\n', "tensor_map[0].stride: unknown field"),
    (MAPS * 5, "at most 4 tensor maps"),
])
def test_bad_tables_name_the_field(tmp_path, table, fragment):
    with pytest.raises(VariantError) as info:
        load_variant_dir(_variant(tmp_path, HEAD + table))
    msg = str(info.value)
    assert fragment in msg and "manifest.toml" in msg, msg
    assert "\n" not in msg.strip()


@pytest.mark.parametrize("box, fragment", [
    (Box(512, 64, 128), "each side must be 1..256"),
    (Box(128, 0, 128), "each side must be 1..256"),
    (Box(128, 12, 0), "multiple of 16 bytes"),
    (Box(128, 128, 128), "wider than its 128-byte swizzle"),
    (Box(128, 32, 48), "swizzle 48"),
])
def test_boxes_tma_cannot_move_are_refused_with_the_rule(box, fragment):
    with pytest.raises(TensorMapError, match=fragment):
        box.check(2)
    Box(128, 64, 128).check(2)        # the shipped kernel's box is fine


def test_encode_refuses_tensors_tma_cannot_describe():
    # Checked before the driver is asked, so no GPU is needed for these.
    with pytest.raises(TensorMapError, match="unit stride"):
        encode(torch.zeros(2, 2, 8, 64, dtype=torch.float16).transpose(2, 3), Box(8, 8, 0))
    with pytest.raises(TensorMapError, match="dtype"):
        encode(torch.zeros(1, 1, 8, 64, dtype=torch.float32), Box(8, 8, 0))


def test_the_parameter_block_carries_the_maps_address():
    case = Case(1, 2, 2, 64, 64, 64, "float16", MaskKind.NONE)
    inputs = make_inputs(case)
    out = torch.empty_like(inputs.q)
    lse = torch.empty(1, 2, 64)
    maps = torch.zeros(3 * 128, dtype=torch.uint8)
    built = build_params(case, inputs, out, lse, [], 1, tensor_maps=maps)
    assert int(built["tensor_maps"]) == maps.data_ptr()
    assert maps in built.keepalive
    assert int(build_params(case, inputs, out, lse, [], 1)["tensor_maps"]) == 0
    assert field_offsets()["tensor_maps"] % 8 == 0


def test_fa3_wgmma_declares_q_k_v_maps_in_the_order_its_kernel_reads():
    spec = load_variant_dir(KERNELS_ROOT / "fa3_wgmma")
    assert [m.tensor for m in spec.tensor_maps] == ["q", "k", "v"]
    src = spec.full_source()
    assert "maps + 128" in src and "maps + 256" in src   # K at 1, V at 2


BACKWARD = """
[backward]
[[backward.launch]]
entry = "v_bwd_{dtype}"
grid = ["ceil_div(seqlen_k, 128)", "kv_heads", "batch"]
block = [256, 1, 1]

[[backward.tensor_map]]
tensor = "dout"
box_rows = "8192 // head_dim"
box_cols = 64
"""
KERNEL_BWD = KERNEL + 'extern "C" __global__ void v_bwd_fp16(FaParams p) {}\n'


def _variant_bwd(root: Path, manifest: str) -> Path:
    d = _variant(root, manifest)
    (d / "v.cu").write_text(KERNEL_BWD)
    return d


def test_the_backward_has_its_own_maps_and_may_map_dout(tmp_path):
    spec = load_variant_dir(_variant_bwd(tmp_path, HEAD + MAPS + BACKWARD))
    assert [m.tensor for m in spec.pass_tensor_maps()] == ["k"]
    assert [m.tensor for m in spec.pass_tensor_maps(backward=True)] == ["dout"]
    case = Case(2, 4, 4, 256, 256, 128, "float16", MaskKind.NONE)
    fwd = CudaVariant.from_spec(spec)
    bwd = CudaVariant.from_spec(spec)
    bwd.backward_pass = True   # as run_backward makes it
    assert fwd.tensor_map_boxes(case, num_splits=1, sm_count=132) == [("k", Box(128, 64, 128))]
    assert bwd.tensor_map_boxes(case, num_splits=1, sm_count=132) == [("dout", Box(64, 64, 128))]


def test_dout_is_the_backwards_alone(tmp_path):
    with pytest.raises(VariantError) as info:
        load_variant_dir(_variant(tmp_path, HEAD + MAPS.replace('tensor = "k"', 'tensor = "dout"')))
    assert "tensor_map[0].tensor" in str(info.value) and "'dout'" in str(info.value)
    bad = BACKWARD.replace('tensor = "dout"', 'tensor = "dq"')
    with pytest.raises(VariantError) as info:
        load_variant_dir(_variant_bwd(tmp_path, HEAD + bad))
    assert "backward.tensor_map[0].tensor" in str(info.value), str(info.value)


def test_fa3_wgmma_backward_maps_q_k_v_dout_in_the_order_its_kernel_reads():
    spec = load_variant_dir(KERNELS_ROOT / "fa3_wgmma")
    assert [m.tensor for m in spec.pass_tensor_maps(backward=True)] == ["q", "k", "v", "dout"]
    src = spec.full_source()
    # tma_tile(dst, map, ...): Q is map 0, K 1, V 2, dO 3.
    for call in ("tma_tile(sQ0 + st * QS_BYTES, 0,", "tma_tile(sK, 1,", "tma_tile(sV, 2,",
                 "tma_tile(sdO0 + st * QS_BYTES, 3,"):
        assert call in src, call


def test_a_causal_case_can_run_its_own_entry_with_its_own_tile(tmp_path):
    # `causal` (1 under a causal mask, 0 otherwise) in the expressions: two launches whose
    # grids are multiplied by causal and 1 - causal run one entry each, and the K map's
    # box follows the mask (128-key tiles under a causal mask, 176 otherwise).
    manifest = HEAD.replace('masks = ["none"]', 'masks = ["none", "causal_br", "causal_tl"]')
    manifest = manifest.replace(
        'grid = ["ceil_div(seqlen_q, block_q)", "heads", "batch"]',
        'grid = ["ceil_div(seqlen_q, block_q) * (1 - causal)", "heads", "batch"]')
    manifest += """
[[launch]]
entry = "v_fwd_causal_{dtype}"
grid = ["ceil_div(seqlen_q, block_q) * causal", "heads", "batch"]
block = [384, 1, 1]

[[tensor_map]]
tensor = "k"
box_rows = "176 - 48 * causal"
box_cols = 64
swizzle = 128
"""
    d = _variant(tmp_path, manifest)
    (d / "v.cu").write_text(KERNEL + 'extern "C" __global__ void v_fwd_causal_fp16(FaParams p) {}\n')
    v = CudaVariant.from_spec(load_variant_dir(d))
    for mask, entry, rows in [(MaskKind.NONE, "v_fwd_fp16", 176),
                              (MaskKind.CAUSAL_BR, "v_fwd_causal_fp16", 128),
                              (MaskKind.CAUSAL_TL, "v_fwd_causal_fp16", 128)]:
        case = Case(2, 4, 4, 256, 256, 128, "float16", mask)
        run = [p.entry for p in v.plan(case, num_splits=1, sm_count=132) if not p.skipped]
        assert run == [entry], (mask, run)
        assert v.tensor_map_boxes(case, num_splits=1, sm_count=132) == [("k", Box(rows, 64, 128))]


def test_fa3_wgmma_takes_128_key_tiles_under_a_short_causal_mask_at_d128():
    # The shipped manifest: 128-key K/V tiles (the fwdc entries) under a causal mask at
    # d = 128 with at most 3072 keys, 176-key tiles otherwise at d = 128, 128 at d = 64.
    v = CudaVariant.from_spec(load_variant_dir(KERNELS_ROOT / "fa3_wgmma"))
    for n, d, mask, entry, rows in [
            (2048, 128, MaskKind.CAUSAL_BR, "fa3_wgmma_fwdc_fp16_d128", 128),
            (3072, 128, MaskKind.CAUSAL_TL, "fa3_wgmma_fwdc_fp16_d128", 128),
            (3073, 128, MaskKind.CAUSAL_BR, "fa3_wgmma_fwd_fp16_d128", 176),
            (4096, 128, MaskKind.CAUSAL_BR, "fa3_wgmma_fwd_fp16_d128", 176),
            (2048, 128, MaskKind.NONE, "fa3_wgmma_fwd_fp16_d128", 176),
            (2048, 64, MaskKind.CAUSAL_BR, "fa3_wgmma_fwd_fp16_d64", 128)]:
        case = Case(1, 4, 4, n, n, d, "float16", mask)
        run = [p.entry for p in v.plan(case, num_splits=1, sm_count=132) if not p.skipped]
        assert run == [entry], (n, d, mask, run)
        boxes = v.tensor_map_boxes(case, num_splits=1, sm_count=132)
        assert [b.rows for t, b in boxes if t in ("k", "v")] == [rows, rows], (n, d, mask)
