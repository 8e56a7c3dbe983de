"""Head dims of today's models: 96, 192, 256, and a V head dim d_v of its own (d_qk = 192,
d_v = 128). The case axis, the shapes the harness draws and allocates, the oracle, FLOPs
and the IO model with d_qk and d_v apart, what candidates declare, and the FA2 model."""

from __future__ import annotations

import pytest
import torch

from harness.candidates.models import FA2Model, all_models
from harness.candidates.python_candidate import PythonKernel, to_candidate
from harness.core import iomodel
from harness.core.buffers import OutputBuffers
from harness.core.candidate import Support
from harness.core.cases import Case, Layout, MaskKind, make_grad_output, make_inputs
from harness.core.check import check_case
from harness.core.check_grad import check_backward_case
from harness.core.flops import attention_bwd_flops, attention_flops, visible_pairs
from harness.core.reference import attention_naive, attention_ref
from harness.core.results import Status

M = MaskKind
MLA = Case(2, 4, 2, 113, 203, 192, "float16", M.CAUSAL_BR, head_dim_v=128)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_case_axis():
    assert MLA.id == "b2h4k2-113x203-d192v128-fp16-causal_br" and MLA.dv == 128
    assert Case.from_id(MLA.id) == MLA and Case.from_dict(MLA.to_dict()) == MLA
    same = Case(2, 4, 2, 113, 203, 128, head_dim_v=128)
    assert same.head_dim_v == 0 and same == Case(2, 4, 2, 113, 203, 128)
    assert "head_dim_v" not in same.to_dict() and "head_dim_v" not in MLA.columns()
    with pytest.raises(ValueError, match="head_dim_v must be"):
        Case(1, 4, 4, 64, 64, 64, head_dim_v=-2)
    with pytest.raises(ValueError, match="dense layout only"):
        Case(2, 4, 4, 64, 64, 64, layout=Layout.VARLEN, head_dim_v=32)


def test_inputs_and_buffers_have_d_v_where_v_and_out_are():
    inputs = make_inputs(MLA)
    assert inputs.q.shape[-1] == inputs.k.shape[-1] == 192 and inputs.v.shape[-1] == 128
    assert OutputBuffers.allocate(MLA, "cpu", True).out.shape == (2, 4, 113, 128)
    assert make_grad_output(MLA).shape == (2, 4, 113, 128)
    # Cases with one head dim are drawn as before.
    plain = Case(2, 4, 2, 113, 203, 192, "float16", M.CAUSAL_BR)
    assert torch.equal(make_inputs(plain).v, make_inputs(plain).v)
    assert make_inputs(plain).v.shape[-1] == 192


def test_the_oracle_scales_by_d_qk_and_returns_d_v_columns():
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 2, 7, 24, generator=gen), torch.randn(1, 1, 9, 24, generator=gen)
    v = torch.randn(1, 1, 9, 16, generator=gen)
    out, lse = attention_ref(q, k, v, causal=True)
    s = (q.double() @ k.double().transpose(-1, -2)) / 24 ** 0.5
    s = s.masked_fill(torch.arange(9)[None, :] > torch.arange(7)[:, None] + 2, float("-inf"))
    torch.testing.assert_close(out, torch.softmax(s, -1) @ v.double())
    torch.testing.assert_close(lse, torch.logsumexp(s, -1))
    naive, _ = attention_naive(q.half(), k.half(), v.half(), causal=True)
    assert naive.shape == (1, 2, 7, 16) and naive.dtype == torch.float16


def test_flops_use_d_qk_and_d_v_apart():
    pairs = visible_pairs(MLA)
    assert attention_flops(MLA) == (2 * 192 + 2 * 128) * pairs
    assert attention_bwd_flops(MLA) == (6 * 192 + 4 * 128) * pairs
    same = Case(2, 4, 2, 113, 203, 128, "float16", M.CAUSAL_BR)
    assert attention_flops(same) == 4 * 128 * visible_pairs(same)
    assert attention_bwd_flops(same) == 10 * 128 * visible_pairs(same)


@pytest.mark.parametrize("algorithm", iomodel.ALGORITHMS)
def test_the_io_model_reads_k_at_d_qk_and_v_at_d_v(algorithm: str):
    tiles = {"splits": 3} if algorithm == "splitkv" else None
    got = iomodel.hbm_breakdown(algorithm, MLA, tiles)
    wide = iomodel.hbm_breakdown(algorithm, Case(2, 4, 2, 113, 203, 192, "float16",
                                                 M.CAUSAL_BR), tiles)
    narrow = iomodel.hbm_breakdown(algorithm, Case(2, 4, 2, 113, 203, 128, "float16",
                                                   M.CAUSAL_BR), tiles)
    assert got["read K"] == wide["read K"] and got["read V"] == narrow["read V"]
    assert got["write O"] == narrow["write O"]
    if "read Q" in got:
        assert got["read Q"] == wide["read Q"]


def test_the_fa2_model_moves_what_the_io_model_says():
    case = Case(2, 4, 2, 300, 500, 192, "float16", M.NONE, head_dim_v=128)
    model = FA2Model()
    out = torch.empty(2, 4, 300, 128, dtype=torch.float16)
    model.run(case, make_inputs(case), out, torch.empty(2, 4, 300))
    assert model.last_bytes.total == iomodel.hbm_bytes("fa2", case, model.tiles)


def test_declarations():
    assert Support().reason_unsupported(MLA) == \
        "d_v != d_qk not supported (declares head_dim_v = false)"
    assert Support(head_dim_v=True).reason_unsupported(MLA) is None
    assert "head_dim_v 128 not supported" in Support(
        head_dim_v=True, head_dims=frozenset({192})).reason_unsupported(MLA)
    for model in all_models():
        want = Status.PASSED if model.name in ("fa2_model", "splitkv_model") else \
            Status.SKIPPED
        result = check_case(model, MLA, device="cpu")
        assert result.status is want, (model.name, result.message)
    res = check_backward_case(FA2Model(), MLA, device="cpu")
    assert res.status is Status.SKIPPED and "d_v != d_qk" in res.message


def _eager(q, k, v, *, mask_kind, mask, key_lengths, causal_offset, scale):
    return attention_naive(q, k, v, causal=mask_kind != "none")[0]


def test_a_python_candidate_declaring_head_dim_v_gets_v_at_d_v():
    plain = to_candidate(PythonKernel("plain", _eager, device="cpu"), "test")
    wide = to_candidate(PythonKernel("wide", _eager, device="cpu", head_dim_v=True), "test")
    assert check_case(plain, MLA, device="cpu").status is Status.SKIPPED
    result = check_case(wide, MLA, device="cpu")
    assert result.status is Status.PASSED, result.message
