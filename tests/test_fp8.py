"""FP8 inputs (harness.core.fp8): the case axis, the harness-owned descales, the oracle
and the naive yardstick on dequantized inputs, declared support, the IO model's bytes, and
the FA2 and split-KV models on e4m3 Q/K/V and e4m3 KV caches."""

from __future__ import annotations

import pytest
import torch

from harness.candidates.models import FA2Model, SplitKVModel, all_models
from harness.candidates.python_candidate import PythonKernel, to_candidate
from harness.core import iomodel
from harness.core.buffers import InputSnapshot
from harness.core.candidate import Support
from harness.core.cases import Case, Fp8, Layout, MaskKind, make_inputs
from harness.core.check import check_case
from harness.core.check_grad import check_backward_case
from harness.core.flops import attention_flops
from harness.core.fp8 import E4M3_MAX, dequantized
from harness.core.reference import (
    attention_naive,
    attention_ref,
    case_flags,
    naive_for_case,
    reference_for_case,
)
from harness.core.results import CaseResult, Status
from harness.core.serving import tensor_shapes
from harness.records.record import RunRecord, validate

M = MaskKind
QKV_HEAD = Case(2, 4, 2, 113, 203, 64, "bfloat16", M.CAUSAL_BR, fp8=Fp8.QKV_HEAD)
QKV_TENSOR = Case(2, 4, 4, 113, 203, 64, "float16", M.NONE, fp8=Fp8.QKV_TENSOR)
KV_HEAD = Case(1, 8, 2, 1, 239, 128, "bfloat16", M.NONE, fp8=Fp8.KV_HEAD)
KV_TOKEN = Case(4, 8, 2, 4, 300, 64, "float16", M.CAUSAL_BR, fp8=Fp8.KV_TOKEN)
PAGED_TOKEN = Case(5, 4, 2, 1, 239, 64, "float16", M.NONE, layout=Layout.PAGED, page_size=16,
                   fp8=Fp8.KV_TOKEN)
VARLEN_HEAD = Case(6, 4, 2, 17, 130, 64, "bfloat16", M.CAUSAL_BR, layout=Layout.VARLEN,
                   fp8=Fp8.KV_HEAD)
# One key a page: a per-slot descale shaped (P, Hkv, 1), still gathered per slot.
PAGE_OF_ONE = Case(3, 4, 2, 2, 37, 64, "bfloat16", M.CAUSAL_BR, layout=Layout.PAGED,
                   page_size=1, fp8=Fp8.KV_TOKEN)
FP8_CASES = (QKV_HEAD, QKV_TENSOR, KV_HEAD, KV_TOKEN, PAGED_TOKEN, VARLEN_HEAD, PAGE_OF_ONE)
E4M3 = torch.float8_e4m3fn

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- the case axis ------------------------------------------------------------------------------

def test_the_case_axis():
    assert QKV_HEAD.id == "b2h4k2-113x203-d64-bf16-causal_br-fp8_qkv_head"
    assert PAGED_TOKEN.id == "b5h4k2-1x239-d64-fp16-none-paged16-fp8_kv_token"
    extra = Case(2, 4, 2, 64, 64, 64, softcap=20.0, sinks=True, dist="outliers",
                 fp8="qkv_tensor", seed=3)
    assert extra.id.endswith("-sc20-sink-outliers-fp8_qkv_tensor-s3")
    for case in (*FP8_CASES, extra):
        assert Case.from_id(case.id) == case and Case.from_dict(case.to_dict()) == case
        assert "fp8" not in case.columns()
    plain = Case(2, 4, 2, 113, 203, 64)
    assert plain.fp8 is Fp8.NONE and "fp8" not in plain.to_dict()
    assert plain.id == "b2h4k2-113x203-d64-fp16-none"
    with pytest.raises(ValueError, match="fp8 'e5m2' is not one of"):
        Case(1, 4, 4, 64, 64, 64, fp8="e5m2")
    with pytest.raises(ValueError, match="dense layout only"):
        Case(2, 4, 4, 64, 64, 64, layout=Layout.VARLEN, fp8="qkv_head")


def test_a_record_of_fp8_cases_validates_and_reads_back(tmp_path):
    results = [CaseResult("fa2_model", case, Status.PASSED, message="ok") for case in FP8_CASES]
    rec = RunRecord.from_results(results, {"commit": "a" * 40, "source": "cli",
                                           "grids": ["mods"]})
    assert validate(rec.to_dict()) == []
    back = RunRecord.read(rec.write(tmp_path / "r.json"))
    assert [r.case for r in back.case_results()] == list(FP8_CASES)


def test_flops_are_those_of_the_same_case_in_half_precision():
    for case in FP8_CASES:
        half = Case(**{**case.to_dict(), "fp8": "none"})
        assert attention_flops(case) == attention_flops(half)


# --- the inputs and their descales --------------------------------------------------------------

@pytest.mark.parametrize("case, shapes", [
    (QKV_TENSOR, ((1, 1, 1), (1, 1, 1), (1, 1, 1))),
    (QKV_HEAD, ((2, 4, 1), (2, 2, 1), (2, 2, 1))),
    (KV_HEAD, (None, (1, 2, 1), (1, 2, 1))),
    (KV_TOKEN, (None, (4, 2, 300), (4, 2, 300))),
])
def test_descales_at_each_granularity(case: Case, shapes: tuple):
    inputs = make_inputs(case)
    got = tuple(None if d is None else tuple(d.shape)
                for d in (inputs.q_descale, inputs.k_descale, inputs.v_descale))
    assert got == shapes
    assert inputs.q.dtype == (E4M3 if case.fp8.quantizes_q else case.torch_dtype)
    for x, d in ((inputs.k, inputs.k_descale), (inputs.v, inputs.v_descale)):
        assert x.dtype == E4M3 and d.dtype == torch.float32
        # The largest element of every group lands on e4m3's largest value.
        top = x.float().abs().amax(dim=-1).amax(dim=tuple(i for i in range(3)
                                                          if d.shape[i] == 1), keepdim=True)
        assert bool((top == E4M3_MAX).all())


def test_the_values_are_the_drawn_inputs_to_e4m3_precision():
    fp8, half = make_inputs(QKV_TENSOR), make_inputs(Case(**{**QKV_TENSOR.to_dict(),
                                                              "fp8": "none"}))
    values = dequantized(fp8, torch.float64)
    assert values.q_descale is None and values.q.dtype == torch.float64
    for got, drawn in ((values.q, half.q), (values.k, half.k), (values.v, half.v)):
        # The fp8 case is drawn from its own seed (its id differs): compare the
        # distributions' scale, and the rounding on its own draw below.
        assert 0.9 < float(got.std()) / float(drawn.double().std()) < 1.1
    again = make_inputs(QKV_TENSOR)
    assert torch.equal(fp8.k.view(torch.int8), again.k.view(torch.int8))
    assert not torch.equal(fp8.k.view(torch.int8), make_inputs(QKV_TENSOR, secret=9).k
                           .view(torch.int8))


def test_a_paged_pool_has_a_descale_per_slot():
    inputs = make_inputs(PAGED_TOKEN)
    pool = tensor_shapes(PAGED_TOKEN)["kv"]
    assert tuple(inputs.k.shape) == pool and inputs.k.dtype == E4M3
    assert tuple(inputs.k_descale.shape) == pool[:3]
    assert inputs.q.dtype == torch.float16 and inputs.q_descale is None


def test_a_modified_descale_is_caught_like_a_modified_input():
    inputs = make_inputs(KV_TOKEN)
    snap = InputSnapshot.take(inputs)
    inputs.v_descale[0, 0, 0] *= 2
    assert "input v_descale was modified" in snap.changed(inputs)


# --- the oracle and the naive yardstick ---------------------------------------------------------

def test_the_oracle_computes_on_the_dequantized_inputs_in_float64():
    for case in (QKV_HEAD, KV_TOKEN):
        inputs = make_inputs(case)
        q = inputs.q.double() * (inputs.q_descale.double()[..., None]
                                 if inputs.q_descale is not None else 1.0)
        k = inputs.k.double() * inputs.k_descale.double()[..., None]
        v = inputs.v.double() * inputs.v_descale.double()[..., None]
        want = attention_ref(q, k, v, **case_flags(case, inputs))
        got = reference_for_case(case, inputs)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_the_fp8_yardstick_rounds_p_to_e4m3():
    inputs = make_inputs(QKV_HEAD)
    ref, _ = reference_for_case(QKV_HEAD, inputs)
    base, lse = naive_for_case(QKV_HEAD, inputs)
    assert base.dtype == torch.bfloat16 and lse.dtype == torch.float32
    values = dequantized(inputs, torch.float32)
    plain, _ = attention_naive(values.q, values.k, values.v, **case_flags(QKV_HEAD, inputs))
    fp8_err = float((base.double() - ref).abs().max())
    f32_err = float((plain.double() - ref).abs().max())
    # e4m3 P (3 mantissa bits) errs well beyond float32 arithmetic rounded to bf16 ...
    assert fp8_err > 2 * f32_err
    # ... and still well within what the quantity is: N(0, 1) values averaged.
    assert fp8_err < 0.1


def test_the_kv_cache_yardstick_dequantizes_into_the_query_dtype():
    inputs = make_inputs(KV_HEAD)
    values = dequantized(inputs, torch.bfloat16)
    want = attention_naive(values.q, values.k, values.v, **case_flags(KV_HEAD, inputs))
    got = naive_for_case(KV_HEAD, inputs)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


# --- declarations -------------------------------------------------------------------------------

def test_undeclared_fp8_is_skipped_with_the_reason():
    assert Support().reason_unsupported(QKV_HEAD) == ("fp8 q/k/v not supported (declares "
                                                      "fp8 = false)")
    assert Support().reason_unsupported(KV_TOKEN) == ("fp8 KV cache not supported "
                                                      "(declares fp8_kv = false)")
    assert Support(fp8=True).reason_unsupported(QKV_HEAD) is None
    assert Support(fp8=True).reason_unsupported(KV_TOKEN) is not None
    assert Support(fp8_kv=True).reason_unsupported(KV_TOKEN) is None
    for model in all_models():
        result = check_case(model, QKV_TENSOR, device="cpu")
        want = Status.PASSED if model.name in ("fa2_model", "splitkv_model") else \
            Status.SKIPPED
        assert result.status is want, (model.name, result.message)


def test_the_backward_of_fp8_cases_is_skipped_with_the_reason():
    res = check_backward_case(FA2Model(), Case(1, 4, 4, 64, 64, 64, fp8="qkv_tensor"),
                              device="cpu")
    assert res.status is Status.SKIPPED and "fp8" in res.message


seen: list[list[str]] = []


def _dequantizing(q, k, v, *, mask_kind, mask, key_lengths, causal_offset, scale, **kw):
    """A plain attention that dequantizes what it is given (descales or none)."""
    seen.append(sorted(kw))

    def value(x, d):
        return x.float() if d is None else x.float() * d[..., None]

    out, _ = attention_naive(value(q, kw.get("q_descale")), value(k, kw.get("k_descale")),
                             value(v, kw.get("v_descale")), causal=mask_kind != "none")
    return out.to(kw.get("out_dtype", torch.float16))


def test_python_candidates_declaring_fp8_get_the_descales():
    seen.clear()
    case = Case(2, 4, 2, 64, 96, 64, "float16", M.CAUSAL_BR, fp8="qkv_head")
    plain = to_candidate(PythonKernel("plain", _dequantizing, device="cpu",
                                      masks=("none", "causal_br")), "test")
    fp8 = to_candidate(PythonKernel("fp8", _dequantizing, device="cpu",
                                    masks=("none", "causal_br"), fp8=True), "test")
    res = check_case(plain, case, device="cpu")
    assert res.status is Status.SKIPPED and "fp8" in res.message and not seen
    res = check_case(fp8, case, device="cpu")
    assert res.status is Status.PASSED, res.message
    assert seen.pop() == ["k_descale", "out_dtype", "q_descale", "v_descale"]
    plain_case = Case(2, 4, 2, 64, 96, 64, "float16", M.CAUSAL_BR)
    assert check_case(fp8, plain_case, device="cpu").status is Status.PASSED


# --- the models and the IO model ----------------------------------------------------------------

@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: c.id)
def test_the_fa2_and_split_kv_models_pass(case: Case):
    for model in (FA2Model(), SplitKVModel(num_splits=3), SplitKVModel()):
        result = check_case(model, case, device="cpu")
        if case.layout is Layout.PAGED and model.name == "fa2_model":
            assert result.status is Status.SKIPPED
            continue
        assert result.status is Status.PASSED, (model.name, result.message)


# Model counter names -> IO model terms (tests/test_model_bytes.py's, with the descales).
_READ = {"Q": "read Q", "K": "read K", "V": "read V", "descales": "read descales",
         "O_partial": "read partials", "LSE_partial": "read partials", "mask": "read mask"}
_WRITE = {"O": "write O", "LSE": "write LSE", "O_partial": "write partials",
          "LSE_partial": "write partials"}


@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: c.id)
def test_model_bytes_match_the_io_model(case: Case):
    for model in (FA2Model(), SplitKVModel(num_splits=3)):
        if model.supports(case):
            continue
        shape = tensor_shapes(case)["out"]
        model.run(case, make_inputs(case), torch.empty(shape, dtype=case.torch_dtype),
                  torch.empty(shape[:3]))
        got: dict[str, int] = {}
        for table, counts in ((_READ, model.last_bytes.reads),
                              (_WRITE, model.last_bytes.writes)):
            for name, n in counts.items():
                got[table[name]] = got.get(table[name], 0) + n
        tiles = model.tiles_for(case) if hasattr(model, "tiles_for") else model.tiles
        want = {k: v for k, v in iomodel.hbm_breakdown(model.algorithm, case, tiles).items()
                if v}
        assert got == want, (model.name, got, want)


def test_the_io_model_counts_a_byte_per_e4m3_element_and_the_scales():
    half = Case(2, 4, 2, 113, 203, 64, "bfloat16", M.CAUSAL_BR)
    for case, q_ratio in ((QKV_HEAD, 2), (Case(**{**half.to_dict(), "fp8": "kv_head"}), 1)):
        fp8, ref = iomodel.hbm_breakdown("fa2", case), iomodel.hbm_breakdown("fa2", half)
        assert fp8["read Q"] * q_ratio == ref["read Q"]
        assert fp8["read K"] * 2 == ref["read K"] and fp8["read V"] * 2 == ref["read V"]
        assert fp8["write O"] == ref["write O"]
        n = 3 if case.fp8.quantizes_q else 2
        assert fp8["read descales"] == case.batch * case.heads * n * 4
    tok = Case(**{**half.to_dict(), "fp8": "kv_token"})
    fp8, ref = iomodel.hbm_breakdown("ideal", tok), iomodel.hbm_breakdown("ideal", half)
    # Every key's row: d bytes of e4m3 and its 4-byte descale, per K/V head.
    assert fp8["read K"] == ref["read K"] // 2 + 2 * 2 * 203 * 4
    assert "read descales" not in fp8


@pytest.mark.parametrize("case", [KV_HEAD, KV_TOKEN, PAGED_TOKEN, VARLEN_HEAD])
def test_split_kv_launches_its_e4m3_cache_entries_for_an_fp8_cache_only(case: Case):
    """The shipped splitkv picks its entries by the size name fp8_kv: the e4m3-cache
    entries for such a case, the 2-byte ones (as before) for its twin."""
    import dataclasses

    from harness.candidates.cuda_candidate import CudaVariant
    from harness.candidates.variants import KERNELS_ROOT, load_variant_dir

    spec = load_variant_dir(KERNELS_ROOT / "splitkv")
    # The manifest does not declare fp8_kv until its entries have passed on a GPU (its
    # comment): the plan is the same either way.
    spec = dataclasses.replace(spec, supports=dataclasses.replace(spec.supports, fp8_kv=True))
    cand = CudaVariant.from_spec(spec)
    assert cand.support.fp8_kv and not cand.support.fp8
    assert cand.supports(case) is None
    assert cand.supports(QKV_HEAD) is not None
    dt, d = {"float16": "fp16", "bfloat16": "bf16"}[case.dtype], case.head_dim
    for c, entry in ((case, f"splitkv_partial8_{dt}_d{d}"),
                     (Case(**{**case.to_dict(), "fp8": "none"}), f"splitkv_partial_{dt}_d{d}")):
        plan = cand.plan(c, num_splits=3, sm_count=132)
        assert [p.entry for p in plan if all(p.grid)] == [entry], c.id  # zero grid: skipped
        assert f"FA_CHECK_ENTRY({entry});" in spec.full_source()  # compiled and checked


def test_the_shipped_split_kv_runs_an_fp8_cache():
    from harness.candidates.cuda_candidate import CudaVariant
    from harness.candidates.variants import KERNELS_ROOT, load_variant_dir

    cand = CudaVariant.from_spec(load_variant_dir(KERNELS_ROOT / "splitkv"))
    assert "fp8_kv = true" in (KERNELS_ROOT / "splitkv" / "manifest.toml").read_text()
    assert cand.supports(KV_TOKEN) is None


def test_e4m3_scores_on_a_cpu_are_the_float32_product():
    from harness.core.fp8 import e4m3_scores

    a = torch.randn(2, 3, 37, 64).to(torch.float8_e4m3fn).float()
    b = torch.randn(2, 3, 53, 64).to(torch.float8_e4m3fn).float()
    assert torch.equal(e4m3_scores(a, b), a @ b.transpose(-1, -2))


def test_e4m3_scores_hand_the_fp8_gemm_what_it_takes(monkeypatch):
    """The tensor-core path's shapes, padding and layouts, against a stand-in for
    torch._scaled_mm that checks cuBLASLt's conditions (sizes in multiples of 16, the
    second operand column-major, unit scales) and multiplies exactly."""
    from harness.core import fp8 as fp8mod

    calls = []

    def scaled_mm(x, y, *, scale_a, scale_b, out_dtype, use_fast_accum):  # noqa: ANN001
        assert x.dtype == y.dtype == torch.float8_e4m3fn and out_dtype == torch.float32
        assert x.shape[1] % 16 == 0 and y.shape[0] % 16 == 0 and y.shape[1] % 16 == 0
        assert x.is_contiguous() and y.stride(0) == 1 and use_fast_accum
        assert scale_a.item() == scale_b.item() == 1.0
        calls.append(x.shape)
        return x.float() @ y.float()

    monkeypatch.setattr(fp8mod, "tensor_core_fp8", lambda device: True)
    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm, raising=False)
    a = torch.randn(1, 3, 37, 72).to(torch.float8_e4m3fn).float()   # B broadcast, d 72
    b = torch.randn(2, 3, 53, 72).to(torch.float8_e4m3fn).float()
    got = fp8mod.e4m3_scores(a, b)
    assert got.shape == (2, 3, 37, 53) and len(calls) == 6
    assert torch.equal(got, (a @ b.transpose(-1, -2)))
