"""The physical floor from the datasheet table, and `suspicious` between it and the
runner's measured ceilings (numbers measured on the H200: copy 4,258 GB/s, fp16 matmul
713 TFLOP/s; cuDNN's decode read K/V at 4,401 GB/s at Nk = 131072)."""

from __future__ import annotations

import pytest

from harness.core.cases import Case, MaskKind
from harness.core.iomodel import GPU_SPECS, datasheet_for, ideal_bytes
from harness.submissions.floor import floors, judge, unfit_ideal_bytes
from harness.submissions.timed import ScoringOptions

H200_MEASURED = {"copy_gbps": 4258.0, "matmul_tflops": 713.0}
DECODE = Case(1, 32, 8, 1, 131072, 128, "float16", MaskKind.NONE)


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H200", "h200"), ("NVIDIA H200 NVL", "h200-nvl"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
])
def test_device_names_find_their_datasheet(name, key):
    spec = datasheet_for(name)
    assert spec is not None and spec.name == key and spec.source


def test_table_values_are_the_datasheets():
    assert (GPU_SPECS["h200"].tflops_fp16, GPU_SPECS["h200"].hbm_tbps) == (989.0, 4.8)
    assert (GPU_SPECS["h100-sxm"].tflops_fp16, GPU_SPECS["h100-sxm"].hbm_tbps) == (989.0, 3.35)
    assert (GPU_SPECS["a100-80gb-sxm"].tflops_fp16,
            GPU_SPECS["a100-80gb-sxm"].hbm_tbps) == (312.0, 2.039)
    assert datasheet_for("NVIDIA GeForce RTX 9090") is None


def test_cudnn_decode_speed_is_not_invalid_on_the_h200():
    cudnn_ms = ideal_bytes(DECODE) / 4401e9 * 1e3
    f = floors(DECODE, ScoringOptions(ceilings=H200_MEASURED), "NVIDIA H200")
    assert f.physical_ms is not None and f.measured_ms is not None
    assert f.physical_ms < cudnn_ms < f.measured_ms
    assert judge(cudnn_ms, f, 0.02).verdict == "suspicious"
    assert judge(cudnn_ms * 0.98, f, 0.02).verdict == "suspicious"  # 2% faster than cuDNN
    assert judge(cudnn_ms * 1.2, f, 0.02).verdict == "ok"
    # Only faster than 4.8 TB/s (less the slack) is impossible.
    assert judge(ideal_bytes(DECODE) / 5.0e12 * 1e3, f, 0.02).verdict == "invalid"


def test_fa3_class_forward_is_not_invalid():
    case = Case(1, 16, 16, 8192, 8192, 128, "float16", MaskKind.NONE)
    from harness.core.flops import attention_flops

    ms_at_750 = attention_flops(case) / 750e12 * 1e3
    f = floors(case, ScoringOptions(ceilings=H200_MEASURED), "NVIDIA H200")
    assert judge(ms_at_750, f, 0.02).verdict == "suspicious"
    assert judge(attention_flops(case) / 1100e12 * 1e3, f, 0.02).verdict == "invalid"


def test_no_calibration_and_unknown_gpu_judge_nothing():
    f = floors(DECODE, ScoringOptions(), "Mystery GPU")
    assert f.physical_ms is None and "no physical floor" in f.gpu
    assert judge(1e-9, f, 0.02).verdict in ("ok", "suspicious")


def test_bytes_that_must_come_from_dram():
    l2 = GPU_SPECS["h200"].l2_bytes
    reads = ideal_bytes(DECODE) - DECODE.batch * DECODE.heads * DECODE.head_dim * 2
    assert unfit_ideal_bytes(DECODE, l2) == reads - l2
    small = Case(1, 1, 1, 64, 64, 64, "float16", MaskKind.NONE)
    assert unfit_ideal_bytes(small, l2) == 0


def test_fp8_floor_uses_the_fp8_peak():
    """An FP8 case's compute ceiling is FP8's (Hopper: twice fp16's): a compute-bound FP8
    forward at 1,500 TFLOP/s on the H100 SXM is possible, the same speed in fp16 is not;
    the A100 has no FP8 tensor cores, so its fp8 floor stays at the fp16 peak."""
    from harness.core.cases import Fp8
    from harness.core.flops import attention_flops

    assert (GPU_SPECS["h100-sxm"].tflops_fp8, GPU_SPECS["h200"].tflops_fp8) == (1979.0, 1979.0)
    assert GPU_SPECS["a100-80gb-sxm"].tflops_fp8 is None
    plain = Case(1, 16, 16, 8192, 8192, 128, "bfloat16", MaskKind.NONE)
    fp8 = Case(1, 16, 16, 8192, 8192, 128, "bfloat16", MaskKind.NONE, fp8=Fp8.QKV_TENSOR)
    cache = Case(1, 16, 16, 8192, 8192, 128, "bfloat16", MaskKind.NONE, fp8=Fp8.KV_HEAD)
    at_1500 = attention_flops(plain) / 1500e12 * 1e3
    h100 = "NVIDIA H100 80GB HBM3"
    f_plain, f_fp8, f_cache = (floors(c, ScoringOptions(), h100) for c in (plain, fp8, cache))
    assert f_plain.physical_ms is not None and f_fp8.physical_ms is not None
    assert f_fp8.physical_ms == pytest.approx(attention_flops(fp8) / 1979e12 * 1e3)
    assert f_cache.physical_ms == f_fp8.physical_ms  # a cache kernel may run e4m3 GEMMs
    assert judge(at_1500, f_plain, 0.02).verdict == "invalid"
    assert judge(at_1500, f_fp8, 0.02).verdict == "ok"
    assert judge(attention_flops(fp8) / 2100e12 * 1e3, f_fp8, 0.02).verdict == "invalid"
    a100 = floors(fp8, ScoringOptions(), "NVIDIA A100-SXM4-80GB")
    assert a100.physical_ms == pytest.approx(attention_flops(fp8) / 312e12 * 1e3)
    # a datasheet given in the options may name its FP8 peak; without one, fp16's
    sheet = {"name": "x", "tflops_fp16": 100.0, "hbm_tbps": 1e6}
    f_sheet = floors(fp8, ScoringOptions(datasheet=sheet), "any")
    f_sheet8 = floors(fp8, ScoringOptions(datasheet={**sheet, "tflops_fp8": 200.0}), "any")
    assert f_sheet.physical_ms == pytest.approx(2 * f_sheet8.physical_ms)
