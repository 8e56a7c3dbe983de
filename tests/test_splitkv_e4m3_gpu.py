"""splitkv's e4m3 -> fp16 / bf16 fragment conversions (splitkv_common.cu) on a GPU: every
one of the 65,536 byte pairs, by both routes (the hardware cvt and the bit moves), against
torch's float8_e4m3fn values. Skipped without a GPU.

Run on the GPU machine:  pytest -m gpu tests/test_splitkv_e4m3_gpu.py -v
"""

from __future__ import annotations

import re

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
cp = pytest.importorskip("cupy")

from harness.candidates.variants import KERNELS_ROOT  # noqa: E402

KERNEL = r"""
extern "C" __global__ void conv(const unsigned* in, unsigned* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned x = in[i];
    out[i] = sk::Mma<FA_DTYPE_FP16>::e4m3x2(x);          // the cvt route where SK_E4M3_CVT
    out[n + i] = sk::Mma<FA_DTYPE_BF16>::e4m3x2(x);
    out[2 * n + i] = sk::e4m3x2_bits_f16x2(x);           // the bit moves
    out[3 * n + i] = sk::e4m3x2_bits_bf16x2(x);
}
"""


def _source() -> str:
    header = (KERNELS_ROOT / "include" / "fa_harness.h").read_text()
    common = (KERNELS_ROOT / "splitkv" / "splitkv_common.cu").read_text()
    common = re.sub(r'^#include "fa_harness.h"$', "", common, flags=re.M)
    return header + "\n" + common + "\n" + KERNEL


def test_every_e4m3_pair_converts_exactly_both_ways():
    pairs = torch.arange(65536, dtype=torch.int32)
    n = pairs.numel()
    mod = cp.RawModule(code=_source(), options=("-std=c++17",))
    fn = mod.get_function("conv")
    x = cp.asarray(pairs.numpy().astype("uint32"))
    out = cp.zeros(4 * n, dtype=cp.uint32)
    fn(((n + 255) // 256,), (256,), (x, out, cp.int32(n)))
    got = torch.from_numpy(cp.asnumpy(out).view("uint16").astype("int32")).view(4, n, 2)
    lo, hi = (pairs & 0xFF).to(torch.uint8), ((pairs >> 8) & 0xFF).to(torch.uint8)
    want = torch.stack([lo.view(torch.float8_e4m3fn).double(),
                        hi.view(torch.float8_e4m3fn).double()], dim=1)
    finite = ~want.isnan()
    for route, dtype in enumerate((torch.float16, torch.bfloat16) * 2):
        vals = got[route].to(torch.int16).view(dtype).double()
        bad = (vals != want) & finite
        assert not bad.any(), (route, dtype, pairs[bad.any(dim=1)][:5].tolist())
