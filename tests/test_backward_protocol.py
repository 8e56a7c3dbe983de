"""The backward protocol of Python candidates and peers, on the CPU: a backward through
autograd (`autograd_backward`) is judged by the same check as any other; the SDPA math
peer and flex_attention (eager here) pass it; what a backward returns is checked, and a
declaration that cannot work is refused where it is read."""

from __future__ import annotations

import pytest
import torch

from harness.candidates.python_candidate import (
    PythonKernel,
    autograd_backward,
    kernels_of,
    to_candidate,
)
from harness.core.cases import Case, MaskKind
from harness.core.check_grad import check_backward_case
from harness.core.results import Status

M = MaskKind
CASES = [Case(2, 4, 4, 33, 47, 32, "float16", M.NONE),
         Case(2, 4, 2, 47, 33, 32, "bfloat16", M.CAUSAL_BR),
         Case(1, 4, 1, 29, 41, 64, "float16", M.CAUSAL_TL),
         Case(3, 4, 4, 21, 37, 32, "float16", M.KEY_PADDING),
         Case(2, 4, 2, 23, 23, 32, "bfloat16", M.RANDOM)]


def eager(q, k, v, *, mask_kind, mask, key_lengths, causal_offset, scale):
    """A plain torch attention (float32 softmax), differentiable."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    nq, nk = s.shape[-2:]
    vis = torch.ones(nq, nk, dtype=torch.bool)
    if mask_kind in ("causal_br", "causal_tl"):
        vis = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + causal_offset
    vis = vis[None, None] if mask is None else vis[None, None] & mask
    s = s.masked_fill(~vis, float("-inf"))
    m = s.amax(dim=-1, keepdim=True).detach()
    e = torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
    den = e.sum(dim=-1, keepdim=True)
    return ((e / torch.where(den > 0, den, torch.ones_like(den))) @ v.float()).to(q.dtype)


def _cand(**kw):
    k = PythonKernel(name="eager_attn", fn=eager, device="cpu", **kw)
    return to_candidate(k, "test")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_backward_through_autograd_passes(case):
    cand = _cand(backward_prepare=autograd_backward(eager))
    assert cand.support.backward and not cand.support.backward_deterministic
    res = check_backward_case(cand, case, device="cpu", repeats=2)
    assert res.status is Status.PASSED, res.message
    assert res.extra["pass"] == "bwd"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_sdpa_math_peer_backward_passes_on_the_cpu(case):
    from harness.candidates.peers import sdpa_peers

    math_peer = next(p for p in sdpa_peers() if p.name == "sdpa_math")
    if math_peer.device != "cpu":
        pytest.skip("sdpa_math runs on the GPU here")
    res = check_backward_case(math_peer, case, device="cpu", repeats=2)
    assert res.status is Status.PASSED, res.message
    assert res.extra["determinism"] == "2 runs bitwise equal"


def test_flex_attention_declares_its_backward_only_where_torch_has_one():
    """torch's flex_attention has no backward on the CPU: declared on the GPU only, so
    the CPU check skips it with the reason instead of calling it an error."""
    from harness.candidates import registry

    flex = next(c for c in registry.discover(("python",)) if c.name == "flex_attention")
    assert flex.support.backward == (flex.device == "cuda")
    if flex.device == "cpu":
        res = check_backward_case(flex, CASES[0], device="cpu")
        assert res.status is Status.SKIPPED and res.message == "declares no backward"


def test_what_a_backward_returns_is_checked():
    case = CASES[1]

    def two(q, k, v, out, lse, dout, **kw):
        return q, k

    def wrong_shape(q, k, v, out, lse, dout, **kw):
        return q, q, v  # dk shaped like q: GQA not summed back to the K/V heads

    def wrong_dtype(q, k, v, out, lse, dout, **kw):
        return q.float(), k, v

    for fn, needle in ((two, "expected (dq, dk, dv)"),
                       (wrong_shape, "dk has shape (2, 4, 47, 32), expected (2, 2, 33, 32)"),
                       (wrong_dtype, "dq has dtype torch.float32, expected torch.bfloat16")):
        res = check_backward_case(_cand(backward=fn), case, device="cpu")
        assert res.status is Status.ERROR and needle in res.message, res.message


def test_a_backward_that_scribbles_on_its_inputs_fails():
    def scribbles(q, k, v, out, lse, dout, **kw):
        grads = autograd_backward(eager)(q, k, v, out, lse, dout, **kw)()
        lse.zero_()
        return grads

    res = check_backward_case(_cand(backward=scribbles), CASES[0], device="cpu")
    assert res.status is Status.FAILED and "input lse was modified" in res.message


def test_a_declaration_that_cannot_work_is_refused_where_it_is_read():
    bad = PythonKernel(name="x", fn=eager, device="cpu", backward="not callable")
    with pytest.raises(TypeError, match="backward is not callable"):
        kernels_of(bad, "test")
    both = PythonKernel(name="y", fn=eager, device="cpu", backward=eager,
                        backward_prepare=autograd_backward(eager))
    with pytest.raises(TypeError, match="not both"):
        kernels_of(both, "test")
    none = _cand()
    assert not none.support.backward
    res = check_backward_case(none, CASES[0], device="cpu")
    assert res.status is Status.SKIPPED and res.message == "declares no backward"
