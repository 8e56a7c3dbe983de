"""The score modifiers (softcap, ALiBi, sinks): the case axis, the inputs the harness
draws, the oracle's semantics against a literal transcription of its doc, the naive
baseline, FLOPs, what candidates declare, and the mods grid on the FA2 model."""

from __future__ import annotations

import math

import pytest
import torch

from harness.candidates.models import FA2Model, SplitKVModel, all_models
from harness.candidates.python_candidate import PythonKernel, to_candidate
from harness.core.candidate import Support
from harness.core.cases import Case, Layout, MaskKind, make_inputs
from harness.core.check import check_case
from harness.core.check_grad import check_backward_case
from harness.core.flops import attention_flops
from harness.core.grid_mods import MOD_SETS
from harness.core.grids import get_grid
from harness.core.reference import attention_naive, attention_ref, reference_for_case
from harness.core.results import Status

M = MaskKind
PLAIN = Case(2, 4, 2, 113, 203, 64, "float16", M.CAUSAL_BR)
DECLARING = ("fa2_model", "splitkv_model")  # the models that apply the modifiers
ALL_MODS = Case(2, 4, 2, 113, 203, 64, "float16", M.CAUSAL_BR, softcap=20.0, alibi=True,
                sinks=True)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- the case axis ------------------------------------------------------------------------

@pytest.mark.parametrize("case", [
    ALL_MODS,
    Case(1, 4, 4, 1, 239, 128, "bfloat16", softcap=7.5, seed=3),
    Case(2, 4, 1, 64, 97, 64, "float16", M.CAUSAL_TL, window_left=16, alibi=True),
    Case(3, 4, 2, 97, 130, 59, "float16", M.KEY_PADDING, sinks=True),
], ids=lambda c: c.id)
def test_case_ids_round_trip_and_dicts_load(case: Case):
    assert Case.from_id(case.id) == case
    assert Case.from_dict(case.to_dict()) == case


def test_unmodified_cases_are_written_and_drawn_as_before():
    assert PLAIN.id == "b2h4k2-113x203-d64-fp16-causal_br"
    assert not {"softcap", "alibi", "sinks"} & set(PLAIN.to_dict())
    assert ALL_MODS.id == "b2h4k2-113x203-d64-fp16-causal_br-sc20-alibi-sink"
    # The database row has no column for them: the case id carries them.
    assert not {"softcap", "alibi", "sinks"} & set(ALL_MODS.columns())
    inputs = make_inputs(PLAIN)
    assert inputs.alibi_slopes is None and inputs.sinks is None


@pytest.mark.parametrize("kw, fragment", [
    ({"softcap": -1.0}, "softcap must be"),
    ({"softcap": math.inf}, "softcap must be"),
    ({"alibi": True, "layout": Layout.VARLEN}, "dense layout only"),
])
def test_invalid_modifiers_are_refused(kw: dict, fragment: str):
    with pytest.raises(ValueError, match=fragment):
        Case(2, 4, 4, 64, 64, 64, **kw)


def test_slopes_and_sinks_are_drawn_per_case_and_secret():
    a, b = make_inputs(ALL_MODS), make_inputs(ALL_MODS)
    assert torch.equal(a.alibi_slopes, b.alibi_slopes) and torch.equal(a.sinks, b.sinks)
    assert a.alibi_slopes.shape == (4,) and a.sinks.shape == (4,)
    assert a.alibi_slopes.dtype == torch.float32 and bool((a.alibi_slopes > 0).all())
    secret = make_inputs(ALL_MODS, secret=12345)
    assert not torch.equal(a.sinks, secret.sinks)
    assert make_inputs(Case(2, 4, 2, 64, 64, 64, alibi=True)).sinks is None


# --- the oracle's semantics -----------------------------------------------------------------

def _literal(q, k, v, *, causal_align: str, causal: bool, softcap: float,
             slopes: torch.Tensor | None, sinks: torch.Tensor | None):
    """reference.py's doc, one (b, h, i) at a time in float64, for tiny problems."""
    b_, h_, nq, d = q.shape
    nk, group = k.shape[2], q.shape[1] // k.shape[1]
    o = nk - nq if causal_align == "bottom_right" else 0
    out = torch.zeros(b_, h_, nq, d, dtype=torch.float64)
    lse = torch.zeros(b_, h_, nq, dtype=torch.float64)
    for b in range(b_):
        for h in range(h_):
            for i in range(nq):
                logits, values = [], []
                for j in range(nk):
                    if causal and j > i + o:
                        continue
                    s = float(q[b, h, i].double() @ k[b, h // group, j].double()) / math.sqrt(d)
                    if softcap:
                        s = softcap * math.tanh(s / softcap)
                    if slopes is not None:
                        s -= float(slopes[h]) * abs(i + o - j)
                    logits.append(s)
                    values.append(v[b, h // group, j].double())
                terms = [math.exp(s) for s in logits]
                denom = sum(terms) + (math.exp(float(sinks[h])) if sinks is not None else 0.0)
                lse[b, h, i] = math.log(denom) if denom > 0 else -math.inf
                for t, val in zip(terms, values, strict=True):
                    out[b, h, i] += t / denom * val
    return out, lse


@pytest.mark.parametrize("causal_align, causal", [("bottom_right", True),
                                                  ("top_left", True),
                                                  ("bottom_right", False)])
@pytest.mark.parametrize("nq, nk", [(5, 9), (9, 5)])
def test_the_oracle_is_its_doc(causal_align: str, causal: bool, nq: int, nk: int):
    gen = torch.Generator().manual_seed(nq * 100 + nk)
    q = torch.randn(1, 4, nq, 16, generator=gen) * 2
    k = torch.randn(1, 2, nk, 16, generator=gen) * 2
    v = torch.randn(1, 2, nk, 16, generator=gen)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    sinks = torch.tensor([-1.0, 0.5, 2.0, 3.5])
    got = attention_ref(q, k, v, causal=causal, causal_align=causal_align, softcap=3.0,
                        alibi_slopes=slopes, sinks=sinks)
    want = _literal(q, k, v, causal_align=causal_align, causal=causal, softcap=3.0,
                    slopes=slopes, sinks=sinks)
    torch.testing.assert_close(got[0], want[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[1], want[1], rtol=1e-12, atol=1e-12)


def test_a_row_that_sees_no_key_has_out_zero_and_the_sink_as_lse():
    case = Case(2, 4, 2, 203, 113, 64, "float16", M.CAUSAL_BR, sinks=True)  # rows 0..89
    inputs = make_inputs(case)
    out, lse = reference_for_case(case, inputs)
    assert bool((out[:, :, :90] == 0).all())
    torch.testing.assert_close(lse[:, :, :90],
                               inputs.sinks.double()[None, :, None].expand(2, 4, 90))
    assert bool(torch.isfinite(lse).all())


def test_the_naive_baseline_applies_the_same_modifiers():
    inputs = make_inputs(ALL_MODS)
    kw = {"causal": True, "softcap": 20.0, "alibi_slopes": inputs.alibi_slopes,
          "sinks": inputs.sinks}
    ref = attention_ref(inputs.q, inputs.k, inputs.v, **kw)
    naive = attention_naive(inputs.q, inputs.k, inputs.v, **kw)
    plain = attention_ref(inputs.q, inputs.k, inputs.v, causal=True)
    assert float((naive[0].double() - ref[0]).abs().max()) < 5e-3
    assert float((naive[1].double() - ref[1]).abs().max()) < 1e-3
    assert float((plain[0] - ref[0]).abs().max()) > 0.1  # the modifiers matter


def test_modifiers_add_no_flops():
    for mod in MOD_SETS:
        case = Case(**{**PLAIN.to_dict(), **mod})
        assert attention_flops(case) == attention_flops(PLAIN)


# --- what candidates declare ------------------------------------------------------------------

@pytest.mark.parametrize("mod, case", [
    ("softcap", Case(1, 4, 4, 64, 64, 64, softcap=10.0)),
    ("alibi", Case(1, 4, 4, 64, 64, 64, alibi=True)),
    ("sinks", Case(1, 4, 4, 64, 64, 64, sinks=True)),
])
def test_undeclared_modifiers_are_skipped_with_the_reason(mod: str, case: Case):
    assert Support().reason_unsupported(Case(1, 4, 4, 64, 64, 64)) is None
    reason = Support().reason_unsupported(case)
    assert reason == f"score modifier {mod} not supported (declares {mod} = false)"
    assert Support(**{mod: True}).reason_unsupported(case) is None
    for model in all_models():
        result = check_case(model, case, device="cpu")
        want = Status.PASSED if model.name in DECLARING else Status.SKIPPED
        assert result.status is want, (model.name, result.message)


def _eager(q, k, v, *, mask_kind, mask, key_lengths, causal_offset, scale, **mods):
    """A plain float32 attention taking the modifier keywords it is given."""
    seen.append(sorted(mods))
    out, _ = attention_naive(q, k, v, causal=mask_kind != "none", softcap=mods.get("softcap", 0.0),
                             alibi_slopes=mods.get("alibi_slopes"), sinks=mods.get("sinks"))
    return out


seen: list[list[str]] = []


def test_python_candidates_get_the_keywords_they_declare_and_no_others():
    seen.clear()
    plain = to_candidate(PythonKernel("plain", _eager, device="cpu",
                                      masks=("none", "causal_br")), "test")
    full = to_candidate(PythonKernel("full", _eager, device="cpu", masks=("none", "causal_br"),
                                     softcap=True, alibi=True, sinks=True), "test")
    assert check_case(plain, PLAIN, device="cpu").status is Status.PASSED
    assert seen.pop() == []
    res = check_case(plain, ALL_MODS, device="cpu")
    assert res.status is Status.SKIPPED and "softcap" in res.message and not seen
    res = check_case(full, ALL_MODS, device="cpu")
    assert res.status is Status.PASSED, res.message
    assert seen.pop() == ["alibi_slopes", "sinks", "softcap"]


def test_the_backward_of_modified_cases_is_skipped_with_the_reason():
    res = check_backward_case(FA2Model(), Case(1, 4, 4, 64, 64, 64, sinks=True), device="cpu")
    assert res.status is Status.SKIPPED and "score modifiers" in res.message


# --- the grid -----------------------------------------------------------------------------------

def test_the_mods_grid_holds_every_modifier_and_mask():
    cases = get_grid("mods")
    assert len(cases) == len(set(cases)) == 74
    assert {c.mask for c in cases} == set(MaskKind)
    assert any(c.softcap and c.alibi and c.sinks for c in cases)
    assert any(c.has_window for c in cases) and any(c.kv_heads == 1 for c in cases)
    assert all(Case.from_id(c.id) == c for c in cases)
    assert sum(c.has_score_mods for c in cases) == 37
    assert {c.fp8.value for c in cases} == {"none", "qkv_tensor", "qkv_head", "kv_head",
                                            "kv_token"}
    assert {c.dist.value for c in cases} == {"normal", "outliers", "large"}
    assert {c.head_dim for c in cases} >= {96, 192, 256}
    assert {(c.head_dim, c.dv) for c in cases if c.head_dim_v} == {(192, 128), (128, 192)}


def test_the_fa2_and_split_kv_models_pass_the_mods_grid():
    # Split-KV with a forced 3 splits: the sink joins the combine (and d_v the partials).
    models = (FA2Model(), SplitKVModel(name="splitkv_3", num_splits=3))
    failures = []
    for case in get_grid("mods"):
        for model in models:
            result = check_case(model, case, device="cpu")
            if (result.status is Status.SKIPPED and model.name == "fa2_model"
                    and case.layout is Layout.PAGED):  # the fp8 paged caches: split-KV's
                continue
            if result.status is not Status.PASSED:
                failures.append(f"{model.name} {case.id}: {result.status.value} "
                                f"{result.message}")
    assert not failures, "\n".join(failures)
