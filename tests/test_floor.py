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
