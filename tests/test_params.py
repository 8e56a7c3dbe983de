"""The host mirror of FaParams: layout against the header (nvcc) and how it is filled."""

from __future__ import annotations

import math

import pytest
import torch

from harness.candidates.compile import compile_with_timeout, nvcc_path
from harness.candidates.params import (
    MASK_BOOL,
    MASK_CAUSAL,
    MASK_KEY_PADDING,
    MASK_TOP_LEFT,
    PARAMS_DTYPE,
    build_params,
    field_offsets,
    layout_asserts,
)
from harness.candidates.variants import header_path
from harness.core.cases import Case, MaskKind, make_inputs

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc not on PATH")


def _layout_source(asserts: str) -> str:
    return header_path().read_text() + "\n" + asserts + \
        '\nextern "C" __global__ void touch(FaParams p) { }\n'


def test_dtype_shape():
    assert PARAMS_DTYPE.itemsize == 544
    offs = field_offsets()
    assert offs["q"] == 0 and offs["workspace"] == 56 and offs["q_batch_stride"] == 88
    assert offs["dout"] == 200 and offs["dv_row_stride"] == 320
    assert offs["batch"] == 328 and offs["scale_log2"] == 372
    assert offs["cu_seqlens_q"] == 376 and offs["block_table_stride"] == 408
    assert list(PARAMS_DTYPE.names)[-15:-10] == ["tensor_maps", "alibi_slopes", "sinks",
                                                  "softcap", "head_dim_v"]
    assert offs["tensor_maps"] == 432 and offs["sinks"] == 448 and offs["head_dim_v"] == 460
    assert offs["q_descale"] == 464 and offs["kd_row_stride"] == 528 and offs["fp8"] == 536


@pytest.mark.nvcc
@needs_nvcc
def test_layout_matches_header_with_nvcc():
    res = compile_with_timeout(_layout_source(layout_asserts()), timeout_s=120, arch="sm_80")
    assert res.ok, res.message


@pytest.mark.nvcc
@needs_nvcc
def test_layout_check_can_fail():
    """The same check with one offset off by 8 must not compile: the test has teeth."""
    broken = layout_asserts().replace("FaParams, seqlen_q) == 340", "FaParams, seqlen_q) == 348")
    assert broken != layout_asserts()
    res = compile_with_timeout(_layout_source(broken), timeout_s=120, arch="sm_80")
    assert not res.ok and "seqlen_q" in res.message


def _outputs(case: Case):
    out = torch.empty(case.batch, case.heads, case.seqlen_q, case.dv,
                      dtype=case.torch_dtype)
    lse = torch.empty(case.batch, case.heads, case.seqlen_q, dtype=torch.float32)
    return out, lse


def test_build_params_fields():
    case = Case(2, 8, 2, 113, 203, 64, "bfloat16", MaskKind.CAUSAL_BR)
    inp = make_inputs(case)
    out, lse = _outputs(case)
    ws = [torch.empty(10), torch.empty(20)]
    bp = build_params(case, inp, out, lse, ws, num_splits=3)
    p = bp.scalar
    assert p["q"] == inp.q.data_ptr() and p["k"] == inp.k.data_ptr()
    assert p["v"] == inp.v.data_ptr() and p["o"] == out.data_ptr() and p["lse"] == lse.data_ptr()
    assert list(p["workspace"]) == [ws[0].data_ptr(), ws[1].data_ptr(), 0, 0]
    assert (p["q_batch_stride"], p["q_head_stride"], p["q_row_stride"]) == (8 * 113 * 64, 113 * 64, 64)
    assert (p["k_batch_stride"], p["k_head_stride"], p["k_row_stride"]) == (2 * 203 * 64, 203 * 64, 64)
    assert (p["batch"], p["heads"], p["kv_heads"]) == (2, 8, 2)
    assert (p["seqlen_q"], p["seqlen_k"], p["head_dim"]) == (113, 203, 64)
    assert p["mask_kind"] == MASK_CAUSAL and p["causal_offset"] == 90
    assert p["dtype"] == 1 and p["num_splits"] == 3
    assert p["mask"] == 0 and p["seqlens_k"] == 0
    assert math.isclose(p["scale"], 0.125, rel_tol=1e-7)
    assert math.isclose(p["scale_log2"], 0.125 * math.log2(math.e), rel_tol=1e-6)
    # the scalar is a view of the array CuPy receives (a byte copy of the scalar would
    # differ in the struct's trailing padding, which a copy does not zero)
    p["num_splits"] = 5
    assert bp.array[0]["num_splits"] == 5  # written through the scalar
    assert bp.array.tobytes()[PARAMS_DTYPE.fields["fp8"][1] + 4:] == bytes(4)  # zeroed


def test_build_params_masks():
    case = Case(3, 4, 4, 17, 33, 64, "float16", MaskKind.RANDOM)
    inp = make_inputs(case)
    out, lse = _outputs(case)
    bp = build_params(case, inp, out, lse, [], num_splits=1)
    p = bp.scalar
    assert p["mask_kind"] == MASK_BOOL and p["causal_offset"] == 0
    (m8,) = bp.keepalive
    assert m8.dtype == torch.uint8 and p["mask"] == m8.data_ptr()
    assert (p["mask_batch_stride"], p["mask_row_stride"]) == (17 * 33, 33)
    assert torch.equal(m8.bool(), inp.mask[:, 0])

    kp = Case(3, 4, 4, 17, 33, 64, "float16", MaskKind.KEY_PADDING)
    inp = make_inputs(kp)
    bp = build_params(kp, inp, *_outputs(kp), [], num_splits=1)
    p = bp.scalar
    assert p["mask_kind"] == MASK_KEY_PADDING and p["mask"] == 0
    (lengths,) = bp.keepalive
    assert p["seqlens_k"] == lengths.data_ptr() and lengths.dtype == torch.int32
    assert lengths.tolist() == inp.key_lengths.tolist()

    tl = Case(1, 1, 1, 40, 20, 64, "float16", MaskKind.CAUSAL_TL)
    p = build_params(tl, make_inputs(tl), *_outputs(tl), [], num_splits=1).scalar
    assert p["mask_kind"] == MASK_CAUSAL | MASK_TOP_LEFT and p["causal_offset"] == 0
    br = Case(1, 1, 1, 40, 20, 64, "float16", MaskKind.CAUSAL_BR)
    p = build_params(br, make_inputs(br), *_outputs(br), [], num_splits=1).scalar
    assert p["causal_offset"] == -20


def test_broadcast_mask_strides_are_zero():
    case = Case(2, 1, 1, 5, 7, 64, "float16", MaskKind.RANDOM)
    inp = make_inputs(case)
    inp.mask = inp.mask[:1, :, :1, :]  # (1, 1, 1, Nk): one row for every batch and query
    p = build_params(case, inp, *_outputs(case), [], num_splits=1).scalar
    assert (p["mask_batch_stride"], p["mask_row_stride"]) == (0, 0)


def test_build_params_rejects_bad_inputs():
    case = Case(1, 2, 2, 8, 8, 64)
    inp = make_inputs(case)
    out, lse = _outputs(case)
    with pytest.raises(ValueError, match="out has shape"):
        build_params(case, inp, out[:, :1], lse, [], num_splits=1)
    with pytest.raises(ValueError, match="dtype"):
        build_params(case, inp, out.float(), lse, [], num_splits=1)
    with pytest.raises(ValueError, match="lse"):
        build_params(case, inp, out, lse.double(), [], num_splits=1)
    with pytest.raises(ValueError, match="num_splits"):
        build_params(case, inp, out, lse, [], num_splits=0)
    with pytest.raises(ValueError, match="at most 4"):
        build_params(case, inp, out, lse, [torch.empty(1)] * 5, num_splits=1)
    bad = Case(1, 2, 2, 8, 8, 64, mask=MaskKind.RANDOM)
    with pytest.raises(ValueError, match="boolean mask"):
        build_params(bad, inp, out, lse, [], num_splits=1)


def test_build_params_score_modifiers_and_dv():
    """The cap, the harness's slopes and sink logits (float32, one per query head) and
    d_v reach the struct; a case without them leaves the slots null / 0."""
    case = Case(2, 4, 2, 16, 24, 64, "float16", MaskKind.CAUSAL_BR, softcap=30.0,
                alibi=True, sinks=True)
    inp = make_inputs(case)
    assert inp.alibi_slopes is not None and inp.sinks is not None
    bp = build_params(case, inp, *_outputs(case), [], num_splits=1)
    p = bp.scalar
    assert p["softcap"] == pytest.approx(30.0) and p["head_dim_v"] == 64
    by_ptr = {t.data_ptr(): t for t in bp.keepalive}
    assert torch.equal(by_ptr[int(p["alibi_slopes"])], inp.alibi_slopes.float())
    assert torch.equal(by_ptr[int(p["sinks"])], inp.sinks.float())

    plain = Case(2, 4, 2, 16, 24, 64, "float16", MaskKind.CAUSAL_BR)
    p = build_params(plain, make_inputs(plain), *_outputs(plain), [], num_splits=1).scalar
    assert (p["softcap"], p["alibi_slopes"], p["sinks"]) == (0.0, 0, 0)

    dv = Case(1, 2, 2, 8, 8, 192, "bfloat16", head_dim_v=128)
    inp = make_inputs(dv)
    assert inp.v.shape[-1] == 128
    p = build_params(dv, inp, *_outputs(dv), [], num_splits=1).scalar
    assert (p["head_dim"], p["head_dim_v"]) == (192, 128)
    assert p["v_row_stride"] == 128 and p["o_row_stride"] == 128
    wrong = torch.empty(1, 2, 8, 192, dtype=dv.torch_dtype)  # O with d_qk columns
    with pytest.raises(ValueError, match="out has shape"):
        build_params(dv, inp, wrong, None, [], num_splits=1)
    bad = make_inputs(case)
    bad.sinks = bad.sinks[:2]
    with pytest.raises(ValueError, match="sinks of shape"):
        build_params(case, bad, *_outputs(case), [], num_splits=1)


@pytest.mark.parametrize(("case_id", "code", "q_strides", "k_strides"), [
    # one descale a tensor: every stride 0
    ("b2h4-13x21-d64-fp16-none-fp8_qkv_tensor", 1, (0, 0, 0), (0, 0, 0)),
    # one a (batch entry, head): q (B, H, 1), k and v (B, Hkv, 1)
    ("b2h4k2-13x21-d64-bf16-causal_br-fp8_qkv_head", 1, (4, 1, 0), (2, 1, 0)),
    # a cache's head: (1, Hkv, 1); q stays in the case dtype, no descale
    ("b2h4k2-1x21-d64-fp16-none-fp8_kv_head", 2, None, (0, 1, 0)),
    # a cache's token and head: (B, Hkv, Nk)
    ("b2h4k2-3x21-d64-fp16-causal_br-fp8_kv_token", 2, None, (42, 21, 1)),
])
def test_build_params_fp8_descales(case_id, code, q_strides, k_strides):
    """An fp8 case's e4m3 tensors reach the struct as bytes with their descales (the
    harness's, unchanged) and the strides that find a row's descale: 0 where one
    descale covers a dim; q in the case dtype has none (docs/fp8.md)."""
    from harness.core.fp8 import e4m3

    case = Case.from_id(case_id)
    inp = make_inputs(case)
    assert inp.k.dtype == e4m3()
    bp = build_params(case, inp, *_outputs(case), [], num_splits=1)
    p = bp.scalar
    assert p["fp8"] == code
    by_ptr = {t.data_ptr(): t for t in bp.keepalive}
    for name, strides, prefix in (("q_descale", q_strides, "qd"), ("k_descale", k_strides, "kd"),
                                  ("v_descale", k_strides, "kd")):
        if strides is None:
            assert p[name] == 0 and inp.q.dtype == case.torch_dtype
            continue
        assert torch.equal(by_ptr[int(p[name])], getattr(inp, name))
        assert tuple(int(p[f"{prefix}_{x}_stride"]) for x in ("batch", "head", "row")) == strides
    # each row's descale is where the strides say: k row n of (b, h) scaled by it
    d = inp.k_descale.expand(*inp.k.shape[:3])
    kd = by_ptr[int(p["k_descale"])].flatten()
    sb, sh, sr = (int(p[f"kd_{x}_stride"]) for x in ("batch", "head", "row"))
    for b, h, n in ((0, 0, 0), (1, 1, inp.k.shape[2] - 1)):
        assert kd[b * sb + h * sh + n * sr] == d[b, h, n]


def test_build_params_fp8_refuses_what_is_not_the_case():
    case = Case.from_id("b2h4k2-13x21-d64-bf16-causal_br-fp8_qkv_head")
    inp = make_inputs(case)
    bad = make_inputs(case)
    bad.k = bad.k.to(case.torch_dtype)  # not e4m3
    with pytest.raises(ValueError, match="k has dtype"):
        build_params(case, bad, *_outputs(case), [], num_splits=1)
    bad = make_inputs(case)
    bad.k_descale = None
    with pytest.raises(ValueError, match="needs k_descale"):
        build_params(case, bad, *_outputs(case), [], num_splits=1)
    bad = make_inputs(case)
    bad.v_descale = bad.v_descale.expand(2, 2, 13).contiguous()
    with pytest.raises(ValueError, match="v_descale of shape"):
        build_params(case, bad, *_outputs(case), [], num_splits=1)
    plain = Case(2, 4, 2, 13, 21, 64, "bfloat16")
    p = build_params(plain, make_inputs(plain), *_outputs(plain), [], num_splits=1).scalar
    assert (p["fp8"], p["q_descale"], p["k_descale"], p["v_descale"]) == (0, 0, 0, 0)
    assert inp.q.dtype != plain.torch_dtype
