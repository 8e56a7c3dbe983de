"""TMA tensor maps for the variants that declare them (`[[tensor_map]]` in a manifest).

A Hopper kernel copies tiles with the Tensor Memory Accelerator, which reads a 128-byte
descriptor of the global tensor (address, sizes, strides, the box one copy moves and the
shared-memory swizzle) that only the host driver can encode: `cuTensorMapEncodeTiled`.
The harness encodes one per declared map for the tensors of a launch, puts them in one
device buffer (128 bytes each, in declaration order) and passes its address as
`FaParams.tensor_maps`; the kernel hands `tensor_maps + 128 * i` to
`cp.async.bulk.tensor`. The buffer is made once per set of tensor addresses, like the
rest of the parameter block (harness.candidates.cuda_candidate).

Every tensor is (batch, heads, rows, head_dim) with a unit stride on head_dim; its map is
4-D, innermost first: (head_dim, rows, heads, batch). A box is `box_cols` x `box_rows`
(x 1 x 1); rows past the tensor's end read as zeros, which is how a tile that overhangs
the sequence is filled. An e4m3 tensor (an FP8 case's Q, K, V or cache) is described with
1-byte elements, so its box's `box_cols` are bytes.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

TENSOR_MAP_BYTES = 128
SWIZZLES = {0: 0, 32: 1, 64: 2, 128: 3}   # bytes -> CUtensorMapSwizzle
# CUtensorMapDataType: e4m3 tensors (FP8 cases) as bytes (UINT8): TMA only moves them.
_DTYPES = {torch.float16: 6, torch.bfloat16: 9, torch.float8_e4m3fn: 0}
_L2_PROMOTION_128B = 2
_INTERLEAVE_NONE = 0
_OOB_FILL_ZERO = 0


class TensorMapError(ValueError):
    """A box or tensor that TMA cannot describe; the message names the rule."""


@dataclass(frozen=True)
class Box:
    rows: int
    cols: int
    swizzle: int  # bytes: 0, 32, 64 or 128

    def check(self, elem_bytes: int) -> None:
        if not (1 <= self.rows <= 256 and 1 <= self.cols <= 256):
            raise TensorMapError(f"box {self.rows} x {self.cols}: each side must be 1..256")
        if (self.cols * elem_bytes) % 16:
            raise TensorMapError(f"box of {self.cols} columns: its rows must be a multiple "
                                 "of 16 bytes")
        if self.swizzle not in SWIZZLES:
            raise TensorMapError(f"swizzle {self.swizzle}: one of 0, 32, 64, 128 (bytes)")
        if self.swizzle and self.cols * elem_bytes > self.swizzle:
            raise TensorMapError(f"box of {self.cols} columns is wider than its "
                                 f"{self.swizzle}-byte swizzle")


@functools.cache
def _encoder():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p,
                   u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def encode(t: torch.Tensor, box: Box) -> bytes:
    """The 128-byte CUtensorMap of a (batch, heads, rows, head_dim) tensor for `box`."""
    if t.dim() != 4 or t.stride(3) != 1:
        raise TensorMapError("a tensor map needs a 4-D tensor with unit stride on head_dim")
    if t.dtype not in _DTYPES:
        raise TensorMapError(f"no tensor map for dtype {t.dtype}")
    elem = t.element_size()
    box.check(elem)
    if t.data_ptr() % 16:
        raise TensorMapError("the tensor's address is not 16-byte aligned")
    sizes = [t.shape[3], t.shape[2], t.shape[1], t.shape[0]]   # innermost first
    strides, packed = [], sizes[0] * elem
    for size, stride in zip(sizes[1:], (t.stride(2), t.stride(1), t.stride(0)), strict=True):
        # A size-1 dimension's stride is never used (torch may give it any value); TMA
        # still checks it, so give it the packed one.
        strides.append(packed if size == 1 else stride * elem)
        packed *= size
    if any(s % 16 or s >= 1 << 40 for s in strides):
        raise TensorMapError(f"strides {strides} (bytes) must be multiples of 16 below 2^40")
    dims = (ctypes.c_uint64 * 4)(*sizes)
    gstrides = (ctypes.c_uint64 * 3)(*strides)
    boxdim = (ctypes.c_uint32 * 4)(box.cols, box.rows, 1, 1)
    estrides = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
    # The encoder writes a 64-byte-aligned struct: take an aligned window of a larger buffer.
    raw = ctypes.create_string_buffer(TENSOR_MAP_BYTES + 64)
    base = ctypes.addressof(raw)
    off = (-base) % 64
    rc = _encoder()(base + off, _DTYPES[t.dtype], 4, t.data_ptr(), dims, gstrides, boxdim,
                    estrides, _INTERLEAVE_NONE, SWIZZLES[box.swizzle], _L2_PROMOTION_128B,
                    _OOB_FILL_ZERO)
    if rc != 0:
        raise TensorMapError(f"cuTensorMapEncodeTiled refused the map (CUresult {rc}) for "
                             f"sizes {sizes}, strides {strides}, box {box.cols} x {box.rows}")
    return raw.raw[off:off + TENSOR_MAP_BYTES]


def device_maps(tensors: list[torch.Tensor], boxes: list[Box]) -> torch.Tensor:
    """The maps of `tensors` (one box each) in one uint8 device tensor, 128 bytes apart.
    torch's allocator aligns blocks to at least 256 bytes, so each map is 64-byte aligned
    as TMA requires."""
    blob = b"".join(encode(t, b) for t, b in zip(tensors, boxes, strict=True))
    host = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    dev = host.to(tensors[0].device)
    assert dev.data_ptr() % 64 == 0
    return dev
