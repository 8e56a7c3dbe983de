"""The FP8 yardstick's S on a GPU with FP8 tensor cores (harness.core.fp8.e4m3_scores):
accumulated as those tensor cores accumulate, so less precisely than float32 and within
what an FP8 MMA keeps (about 12 bits on an H100: bench/fp8_accum_probe.py). Skipped
without such a GPU.

Run on the GPU machine:  pytest -m gpu tests/test_fp8_scores_gpu.py -v
"""

from __future__ import annotations

import pytest
import torch

from harness.core.fp8 import e4m3_scores, tensor_core_fp8

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or not tensor_core_fp8(torch.device("cuda")):
    pytest.skip("no CUDA device with FP8 tensor cores", allow_module_level=True)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_the_scores_carry_the_tensor_cores_rounding(d: int):
    gen = torch.Generator(device="cuda").manual_seed(d)
    a, b = (torch.randn(2, 300, d, device="cuda", generator=gen) * 100 for _ in range(2))
    a, b = (t.clamp(-448, 448).to(torch.float8_e4m3fn).float() for t in (a, b))
    exact = a.double() @ b.double().transpose(-1, -2)
    scale = a.double().abs() @ b.double().abs().transpose(-1, -2)
    rel = ((e4m3_scores(a, b).double() - exact).abs() / scale).max().item()
    f32 = (((a @ b.transpose(-1, -2)).double() - exact).abs() / scale).max().item()
    assert f32 < 1e-6 < rel < 2 ** -10, (f32, rel)
