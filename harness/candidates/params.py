"""Host mirror of `FaParams` (kernels/include/fa_harness.h) and the code that fills it.

The struct is passed to every kernel by value. On the host it is one element of a numpy
structured array with the same field order, offsets and size; tests/test_params.py
generates `static_assert(offsetof(FaParams, f) == N)` lines from this dtype and compiles
them with nvcc, so a change on either side without the other fails CI.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from harness.core.cases import Case, Inputs, Layout, MaskKind

MASK_NONE = 0
MASK_CAUSAL = 1
MASK_KEY_PADDING = 2
MASK_BOOL = 4
MASK_TOP_LEFT = 8  # the causal mask (and the window) aligned top-left: offset 0
MASK_WINDOW = 16  # a sliding window (window_left / window_right)
DTYPE_CODES = {"float16": 0, "bfloat16": 1}
LAYOUT_CODES = {Layout.DENSE: 0, Layout.VARLEN: 1, Layout.PAGED: 2}
FP8_NONE, FP8_QKV, FP8_KV = 0, 1, 2  # FaParams.fp8
NUM_WORKSPACES = 4
LOG2E = 1.4426950408889634

# (name, numpy type, count). Pointers are uint64, `long long` int64, int int32.
_FIELDS: list[tuple[str, str, int]] = [
    ("q", "u8", 1), ("k", "u8", 1), ("v", "u8", 1), ("o", "u8", 1), ("lse", "u8", 1),
    ("mask", "u8", 1), ("seqlens_k", "u8", 1), ("workspace", "u8", NUM_WORKSPACES),
    ("q_batch_stride", "i8", 1), ("q_head_stride", "i8", 1), ("q_row_stride", "i8", 1),
    ("k_batch_stride", "i8", 1), ("k_head_stride", "i8", 1), ("k_row_stride", "i8", 1),
    ("v_batch_stride", "i8", 1), ("v_head_stride", "i8", 1), ("v_row_stride", "i8", 1),
    ("o_batch_stride", "i8", 1), ("o_head_stride", "i8", 1), ("o_row_stride", "i8", 1),
    ("mask_batch_stride", "i8", 1), ("mask_row_stride", "i8", 1),
    ("dout", "u8", 1), ("dq", "u8", 1), ("dk", "u8", 1), ("dv", "u8", 1),
    ("do_batch_stride", "i8", 1), ("do_head_stride", "i8", 1), ("do_row_stride", "i8", 1),
    ("dq_batch_stride", "i8", 1), ("dq_head_stride", "i8", 1), ("dq_row_stride", "i8", 1),
    ("dk_batch_stride", "i8", 1), ("dk_head_stride", "i8", 1), ("dk_row_stride", "i8", 1),
    ("dv_batch_stride", "i8", 1), ("dv_head_stride", "i8", 1), ("dv_row_stride", "i8", 1),
    ("batch", "i4", 1), ("heads", "i4", 1), ("kv_heads", "i4", 1),
    ("seqlen_q", "i4", 1), ("seqlen_k", "i4", 1), ("head_dim", "i4", 1),
    ("mask_kind", "i4", 1), ("causal_offset", "i4", 1), ("dtype", "i4", 1),
    ("num_splits", "i4", 1),
    ("scale", "f4", 1), ("scale_log2", "f4", 1),
    # Serving layouts (harness.core.serving) and sliding windows.
    ("cu_seqlens_q", "u8", 1), ("cu_seqlens_k", "u8", 1), ("seqlens_q", "u8", 1),
    ("block_table", "u8", 1), ("block_table_stride", "i8", 1),
    ("layout", "i4", 1), ("page_size", "i4", 1),
    ("window_left", "i4", 1), ("window_right", "i4", 1),
    # TMA descriptors the manifest's [[tensor_map]] asks for (harness.candidates.tensor_map).
    ("tensor_maps", "u8", 1),
    # Score modifiers and d_v (docs/score-mods.md).
    ("alibi_slopes", "u8", 1), ("sinks", "u8", 1), ("softcap", "f4", 1), ("head_dim_v", "i4", 1),
    # FP8 inputs: the descales of the e4m3 tensors and where each row's is (docs/fp8.md).
    ("q_descale", "u8", 1), ("k_descale", "u8", 1), ("v_descale", "u8", 1),
    ("qd_batch_stride", "i8", 1), ("qd_head_stride", "i8", 1), ("qd_row_stride", "i8", 1),
    ("kd_batch_stride", "i8", 1), ("kd_head_stride", "i8", 1), ("kd_row_stride", "i8", 1),
    ("fp8", "i4", 1),
]


def _make_dtype() -> np.dtype:
    # align=True applies C layout rules (each field at a multiple of its alignment, total
    # size rounded to the largest alignment), which is what nvcc does for the struct.
    spec = [(n, "<" + t, (c,)) if c > 1 else (n, "<" + t) for n, t, c in _FIELDS]
    return np.dtype(spec, align=True)


PARAMS_DTYPE: np.dtype = _make_dtype()


def field_offsets() -> dict[str, int]:
    return {name: PARAMS_DTYPE.fields[name][1] for name in PARAMS_DTYPE.names}


def layout_asserts(struct: str = "FaParams") -> str:
    """C++ static_asserts that hold iff the device struct matches PARAMS_DTYPE."""
    lines = [f"static_assert(__builtin_offsetof({struct}, {n}) == {off}, "
             f"\"FaParams.{n}: host offset {off}\");" for n, off in field_offsets().items()]
    lines.append(f"static_assert(sizeof({struct}) == {PARAMS_DTYPE.itemsize}, "
                 f"\"sizeof(FaParams): host size {PARAMS_DTYPE.itemsize}\");")
    lines.append(f"static_assert(alignof({struct}) == {PARAMS_DTYPE.alignment}, "
                 "\"alignof(FaParams)\");")
    return "\n".join(lines) + "\n"


@dataclass
class BuiltParams:
    """The filled struct plus the device tensors it points to (kept alive until the
    launches are enqueued and, through the stream, done)."""

    array: np.ndarray  # shape (1,), dtype PARAMS_DTYPE
    keepalive: list[torch.Tensor] = field(default_factory=list)

    @property
    def scalar(self) -> np.void:
        return self.array[0]

    def __getitem__(self, name: str):  # convenience for tests and diagnostics
        return self.array[0][name]


def mask_kind_bits(case: Case) -> int:
    bits = MASK_NONE
    if case.mask.is_causal:
        bits |= MASK_CAUSAL
    if case.mask is MaskKind.KEY_PADDING:
        bits |= MASK_KEY_PADDING
    if case.mask is MaskKind.RANDOM:
        bits |= MASK_BOOL
    if case.mask is MaskKind.CAUSAL_TL:
        bits |= MASK_TOP_LEFT
    if case.has_window:
        bits |= MASK_WINDOW
    return bits


def dense_offset(case: Case) -> int:
    """`causal_offset` of the struct: the causal mask's and the window's alignment offset
    of a dense case (a window without a causal mask is bottom-right aligned). Serving
    layouts align per sequence (fa_seq_offset in the header), so theirs is 0."""
    if case.is_serving:
        return 0
    if case.has_window and case.mask is not MaskKind.CAUSAL_TL:
        return case.seqlen_k - case.seqlen_q
    return case.causal_offset


def _strides(t: torch.Tensor, what: str) -> tuple[int, int, int]:
    if t.dim() != 4:
        raise ValueError(f"{what} must be 4-D (batch, heads, seq, head_dim), got {tuple(t.shape)}")
    if t.stride(3) != 1:
        raise ValueError(f"{what} must have a unit stride on head_dim")
    return t.stride(0), t.stride(1), t.stride(2)


def build_params(case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None,
                 workspaces: Sequence[torch.Tensor], num_splits: int,
                 grads: Sequence[torch.Tensor] | None = None,
                 tensor_maps: torch.Tensor | None = None) -> BuiltParams:
    """Fill FaParams for one launch sequence. Tensors must already be on the device.
    A backward launch gives `grads` = (dout, dq, dk, dv); `out` and `lse` are then the
    forward's O and LSE, which the backward reads. `tensor_maps` is the device buffer of
    the launch's TMA descriptors, when the variant declares any."""
    if len(workspaces) > NUM_WORKSPACES:
        raise ValueError(f"at most {NUM_WORKSPACES} workspaces, got {len(workspaces)}")
    if num_splits < 1:
        raise ValueError(f"num_splits must be resolved to >= 1, got {num_splits}")
    arr = np.zeros(1, dtype=PARAMS_DTYPE)
    p = arr[0]
    keep: list[torch.Tensor] = []
    q, k, v = inputs.q, inputs.k, inputs.v
    expect_q = (case.batch, case.heads, case.seqlen_q, case.head_dim)
    expect_kv = (case.batch, case.kv_heads, case.seqlen_k, case.head_dim)
    if case.is_serving:
        from harness.core.serving import tensor_shapes

        shapes = tensor_shapes(case)
        expect_q, expect_kv = shapes["q"], shapes["kv"]
    # V and O have d_v columns (dense cases only, Case.head_dim_v).
    expect_v, expect_o = (*expect_kv[:3], case.dv), (*expect_q[:3], case.dv)
    for t, want, what in ((q, expect_q, "q"), (k, expect_kv, "k"), (v, expect_v, "v"),
                          (out, expect_o, "out")):
        if tuple(t.shape) != want:
            raise ValueError(f"{what} has shape {tuple(t.shape)}, expected {want}")
        dtype = _input_dtype(case, what)
        if t.dtype != dtype:
            raise ValueError(f"{what} has dtype {t.dtype}, expected {dtype}")
    p["q"], p["k"], p["v"], p["o"] = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
    p["q_batch_stride"], p["q_head_stride"], p["q_row_stride"] = _strides(q, "q")
    p["k_batch_stride"], p["k_head_stride"], p["k_row_stride"] = _strides(k, "k")
    p["v_batch_stride"], p["v_head_stride"], p["v_row_stride"] = _strides(v, "v")
    p["o_batch_stride"], p["o_head_stride"], p["o_row_stride"] = _strides(out, "out")
    if lse is not None:
        if tuple(lse.shape) != expect_q[:3] or lse.dtype != torch.float32 or \
                not lse.is_contiguous():
            raise ValueError(f"lse must be contiguous float32 {expect_q[:3]}, got "
                             f"{tuple(lse.shape)} {lse.dtype}")
        p["lse"] = lse.data_ptr()

    bits = mask_kind_bits(case)
    if bits & MASK_BOOL:
        if inputs.mask is None:
            raise ValueError(f"case {case.id} needs a boolean mask tensor")
        m = inputs.mask
        if m.dim() != 4 or m.shape[-1] != case.seqlen_k:
            raise ValueError(f"mask must be (B|1, 1, Nq|1, Nk), got {tuple(m.shape)}")
        # uint8 row-major (B|1, Nq|1, Nk); a size-1 dimension broadcasts with stride 0.
        m8 = m[:, 0].to(device=q.device, dtype=torch.uint8).contiguous()
        keep.append(m8)
        p["mask"] = m8.data_ptr()
        p["mask_batch_stride"] = 0 if m8.shape[0] == 1 else m8.stride(0)
        p["mask_row_stride"] = 0 if m8.shape[1] == 1 else m8.stride(1)
    if bits & MASK_KEY_PADDING:
        if inputs.key_lengths is None:
            raise ValueError(f"case {case.id} needs key_lengths")
        kl = inputs.key_lengths.to(device=q.device, dtype=torch.int32).contiguous()
        if kl.numel() != case.batch:
            raise ValueError(f"key_lengths has {kl.numel()} entries, expected {case.batch}")
        keep.append(kl)
        p["seqlens_k"] = kl.data_ptr()
    ws = np.zeros(NUM_WORKSPACES, dtype=np.uint64)
    for i, w in enumerate(workspaces):
        ws[i] = w.data_ptr()
    p["workspace"] = ws

    p["batch"], p["heads"], p["kv_heads"] = case.batch, case.heads, case.kv_heads
    p["seqlen_q"], p["seqlen_k"], p["head_dim"] = case.seqlen_q, case.seqlen_k, case.head_dim
    p["mask_kind"] = bits
    p["causal_offset"] = dense_offset(case)
    p["dtype"] = DTYPE_CODES[case.dtype]
    p["num_splits"] = num_splits
    scale = 1.0 / math.sqrt(case.head_dim)
    p["scale"] = scale
    p["scale_log2"] = scale * LOG2E
    p["window_left"], p["window_right"] = case.window_left, case.window_right
    p["layout"] = LAYOUT_CODES[case.layout]
    if case.is_serving:
        _serving_fields(p, case, inputs, keep)
    if grads is not None:
        _grad_fields(p, case, grads)
    if tensor_maps is not None:
        keep.append(tensor_maps)
        p["tensor_maps"] = tensor_maps.data_ptr()
    _mod_fields(p, case, inputs, keep)
    _fp8_fields(p, case, inputs, keep)
    return BuiltParams(arr, keep)


def _input_dtype(case: Case, what: str) -> torch.dtype:
    """The dtype a tensor of the launch has: e4m3 where the case's fp8 axis quantizes it
    (harness.core.fp8), else the case dtype."""
    from harness.core.fp8 import Fp8, e4m3

    fp8 = case.fp8
    if fp8 is not Fp8.NONE and (what in ("k", "v") or (what == "q" and fp8.quantizes_q)):
        return e4m3()
    return case.torch_dtype


def _fp8_fields(p: np.void, case: Case, inputs: Inputs, keep: list[torch.Tensor]) -> None:
    """The descales of an fp8 case's e4m3 tensors (float32 on the device, contiguous) and
    their strides by (batch entry or page, head, row or slot): 0 where one descale covers
    that dim (FaParams' doc)."""
    from harness.core.fp8 import Fp8

    if case.fp8 is Fp8.NONE:
        return
    p["fp8"] = FP8_QKV if case.fp8.quantizes_q else FP8_KV
    for name, prefix in (("q_descale", "qd"), ("k_descale", "kd"), ("v_descale", "kd")):
        d = getattr(inputs, name)
        if name == "q_descale" and not case.fp8.quantizes_q:
            continue
        if d is None or d.dim() != 3:
            raise ValueError(f"case {case.id} needs {name} of 3 dims, got "
                             f"{None if d is None else tuple(d.shape)}")
        t = getattr(inputs, name[0])
        if any(n not in (1, m) for n, m in zip(d.shape, t.shape[:3], strict=True)):
            raise ValueError(f"{name} of shape {tuple(d.shape)} does not broadcast against "
                             f"{name[0]}'s {tuple(t.shape[:3])}")
        d = d.to(device=inputs.q.device, dtype=torch.float32).contiguous()
        keep.append(d)
        p[name] = d.data_ptr()
        strides = [0 if n == 1 else s for n, s in zip(d.shape, d.stride(), strict=True)]
        if name == "v_descale" and strides != [int(p[f"kd_{x}_stride"])
                                               for x in ("batch", "head", "row")]:
            raise ValueError("v_descale must have k_descale's shape")
        (p[f"{prefix}_batch_stride"], p[f"{prefix}_head_stride"],
         p[f"{prefix}_row_stride"]) = strides


def _mod_fields(p: np.void, case: Case, inputs: Inputs, keep: list[torch.Tensor]) -> None:
    """The score modifiers (the cap, the ALiBi slopes and sink logits the harness drew,
    float32 on the device, one per query head) and d_v."""
    p["softcap"] = float(case.softcap)
    p["head_dim_v"] = case.dv
    for name, needed in (("alibi_slopes", case.alibi), ("sinks", case.sinks)):
        t = getattr(inputs, name)
        if not needed:
            continue
        if t is None or tuple(t.shape) != (case.heads,):
            raise ValueError(f"case {case.id} needs {name} of shape ({case.heads},), got "
                             f"{None if t is None else tuple(t.shape)}")
        t = t.to(device=inputs.q.device, dtype=torch.float32).contiguous()
        keep.append(t)
        p[name] = t.data_ptr()


def _grad_fields(p: np.void, case: Case, grads: Sequence[torch.Tensor]) -> None:
    dout, dq, dk, dv = grads
    expect_q = (case.batch, case.heads, case.seqlen_q, case.head_dim)
    expect_kv = (case.batch, case.kv_heads, case.seqlen_k, case.head_dim)
    # dO and dV have d_v columns, as O and V.
    for t, want, what in ((dout, (*expect_q[:3], case.dv), "do"), (dq, expect_q, "dq"),
                          (dk, expect_kv, "dk"), (dv, (*expect_kv[:3], case.dv), "dv")):
        if tuple(t.shape) != want or t.dtype != case.torch_dtype:
            raise ValueError(f"{what} is {tuple(t.shape)} {t.dtype}, expected {want} "
                             f"{case.torch_dtype}")
        p["dout" if what == "do" else what] = t.data_ptr()
        (p[f"{what}_batch_stride"], p[f"{what}_head_stride"],
         p[f"{what}_row_stride"]) = _strides(t, what)


def _serving_fields(p: np.void, case: Case, inputs: Inputs, keep: list[torch.Tensor]) -> None:
    """Varlen: slot starts and lengths of q and k; paged: the block table and the cache
    lengths (`seqlens_k`, as key padding uses it). K/V of a paged case are page pools, so
    k_batch_stride is the stride between pages."""
    index = inputs.serving
    if index is None:
        raise ValueError(f"case {case.id} needs its serving index (inputs.serving)")
    dev = inputs.q.device

    def put(name: str, t: torch.Tensor | None) -> None:
        if t is None:
            raise ValueError(f"case {case.id} needs serving.{name}")
        t = t.to(device=dev, dtype=torch.int32).contiguous()
        keep.append(t)
        p[name] = t.data_ptr()

    put("seqlens_q", index.seqlens_q)
    put("seqlens_k", index.seqlens_k)
    if case.layout is Layout.VARLEN:
        put("cu_seqlens_q", index.cu_seqlens_q)
        put("cu_seqlens_k", index.cu_seqlens_k)
    else:
        put("block_table", index.block_table)
        p["block_table_stride"] = index.block_table.shape[1]
        p["page_size"] = case.page_size
