"""The peers on the serving case kinds: flex_attention's sliding windows and varlen
document masks (its mask_mods against the oracle's masks, the whole check, a window edge
off by one caught, the block mask kept per case, paged skipped with the reason), the
Python protocol's serving keywords and varlen copy, and the SDPA peers' windows as a
boolean mask with varlen and paged skipped with the reason."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.candidates import flex, flex_masks, registry
from harness.candidates.peers import SdpaPeer, sdpa_peers
from harness.candidates.python_candidate import PythonKernel, to_candidate
from harness.core import serving
from harness.core.buffers import OutputBuffers
from harness.core.cases import Case, Layout, MaskKind, make_inputs
from harness.core.check import check_case
from harness.core.check_grad import check_backward_case
from harness.core.grids import get_grid
from harness.core.reference import block_visibility
from harness.core.results import Status

VARLEN_BR = Case(6, 4, 2, 37, 53, 64, "float16", MaskKind.CAUSAL_BR, layout=Layout.VARLEN)
VARLEN_TL_WINDOW = Case(5, 6, 2, 20, 41, 64, "bfloat16", MaskKind.CAUSAL_TL, window_left=7,
                        layout=Layout.VARLEN)
VARLEN_TWO_SIDED = Case(5, 4, 1, 30, 47, 64, "float16", MaskKind.NONE, window_left=9,
                        window_right=4, layout=Layout.VARLEN)
DENSE_BR_WINDOW = Case(2, 4, 1, 70, 90, 64, "float16", MaskKind.NONE, window_left=10,
                       window_right=5)
DENSE_TL_WINDOW = Case(2, 4, 2, 90, 70, 64, "bfloat16", MaskKind.CAUSAL_TL, window_left=12)
PAGED = Case(4, 4, 1, 3, 500, 64, "float16", MaskKind.CAUSAL_BR, window_left=32,
             window_right=0, layout=Layout.PAGED, page_size=64)

SERVING = get_grid("serving")
VARLEN_GRID = [c for c in SERVING if c.layout is Layout.VARLEN]
DENSE_WINDOW_GRID = [c for c in SERVING if c.layout is Layout.DENSE and c.has_window]
# Dense windows over the mask kinds the serving grid leaves out.
DENSE_MASKED_WINDOWS = [
    Case(3, 2, 2, 41, 29, 64, "float16", MaskKind.KEY_PADDING, window_left=5, window_right=2),
    Case(2, 2, 2, 29, 41, 64, "float16", MaskKind.RANDOM, window_right=3),
    Case(2, 2, 2, 29, 41, 64, "float16", MaskKind.CAUSAL_BR, window_left=0, window_right=0),
]


@pytest.fixture(autouse=True)
def fresh_masks():
    """No block mask kept from another test: a planted bug must not meet a good mask."""
    flex_masks._cache.clear()
    registry.clear_cache()
    yield
    flex_masks._cache.clear()
    registry.clear_cache()


def _flex():
    return next(c for c in registry.discover(("python",)) if c.name == "flex_attention")


def _dense_mask(mod, case: Case, shape: tuple[int, int, int]) -> torch.Tensor:
    from torch.nn.attention.flex_attention import create_mask

    b, nq, nk = shape
    if mod is None:
        return torch.ones((b, 1, nq, nk), dtype=torch.bool)
    return create_mask(mod, b, None, nq, nk, device="cpu")


# --- the mask_mods against the oracle's masks (CPU, no attention computed) ---------------

@pytest.mark.parametrize("case", VARLEN_GRID + [VARLEN_TL_WINDOW, VARLEN_TWO_SIDED],
                         ids=lambda c: c.id)
def test_varlen_document_mask_is_the_oracles(case):
    inputs = make_inputs(case)
    _, _, _, want = serving.oracle_problem(case, inputs)
    tq, tk = inputs.q.shape[2], inputs.k.shape[2]
    pack = flex_masks.packing(flex_masks.placement_of(inputs.serving), tq, tk,
                              case.mask is MaskKind.CAUSAL_TL, "cpu")
    mod = flex_masks.varlen_mask_mod(case.mask.value, (case.window_left, case.window_right),
                                     pack)
    got = _dense_mask(mod, case, (1, tq, tk))
    assert torch.equal(got, want)
    valid = serving.row_valid(case)
    assert not got[0, 0, ~valid].any()  # padding rows see nothing
    # compact: the sequences' query rows alone, in order (what flex runs on)
    placement = flex_masks.placement_of(inputs.serving)
    rows = flex_masks.sequence_rows(placement)
    assert rows == valid.nonzero().flatten().tolist()
    pack = flex_masks.packing(placement, tq, tk, case.mask is MaskKind.CAUSAL_TL, "cpu",
                              compact=True)
    mod = flex_masks.varlen_mask_mod(case.mask.value, (case.window_left, case.window_right),
                                     pack)
    assert torch.equal(_dense_mask(mod, case, (1, len(rows), tk)), want[:, :, valid])


@pytest.mark.parametrize("case", DENSE_WINDOW_GRID + DENSE_MASKED_WINDOWS, ids=lambda c: c.id)
def test_dense_window_mask_is_block_visibility(case):
    inputs = make_inputs(case)
    nq, nk = case.seqlen_q, case.seqlen_k
    align = "top_left" if case.mask is MaskKind.CAUSAL_TL else "bottom_right"
    want = block_visibility(slice(0, nq), nq, nk, case.mask.is_causal, align, inputs.mask,
                            torch.device("cpu"), (case.window_left, case.window_right))
    mod = flex_masks.dense_mask_mod(case.mask.value, inputs.mask, inputs.key_lengths,
                                    case.causal_offset, (case.window_left, case.window_right),
                                    nq, nk)
    got = _dense_mask(mod, case, (case.batch, nq, nk))
    assert torch.equal(got, want.expand_as(got))


# --- flex_attention through the whole check (eager on the CPU) ---------------------------

CHECKED = [VARLEN_BR, VARLEN_TL_WINDOW, VARLEN_TWO_SIDED, DENSE_BR_WINDOW, DENSE_TL_WINDOW,
           DENSE_MASKED_WINDOWS[0]]


@pytest.mark.parametrize("case", CHECKED, ids=lambda c: c.id)
def test_flex_passes_serving_cases_on_the_cpu(case, one_torch_thread):
    if torch.cuda.is_available():
        pytest.skip("covered on the GPU by test_flex_serving_grid_gpu")
    res = check_case(_flex(), case, device="cpu")
    assert res.status is Status.PASSED, res.message


def _off_by_one(side: str):
    real = flex_masks._band_edges

    def planted(mask_kind, window, device):
        left, right = real(mask_kind, window, device)
        return (left + 1, right) if side == "left" else (left, right - 1)

    return planted


@pytest.mark.parametrize(("case", "side"), [(DENSE_BR_WINDOW, "left"),
                                            (DENSE_TL_WINDOW, "left"),
                                            (VARLEN_TWO_SIDED, "right"),
                                            (VARLEN_TL_WINDOW, "left")],
                         ids=lambda x: x.id if isinstance(x, Case) else x)
def test_a_window_edge_off_by_one_fails_the_check(case, side, monkeypatch, one_torch_thread):
    if torch.cuda.is_available():
        pytest.skip("CPU path")
    monkeypatch.setattr(flex_masks, "_band_edges", _off_by_one(side))
    res = check_case(_flex(), case, device="cpu")
    assert res.status is Status.FAILED, res.message


def test_flex_skips_paged_with_the_reason():
    res = check_case(_flex(), PAGED, device="cpu")
    assert res.status is Status.SKIPPED
    assert res.message == flex.PAGED_REASON and "block table" in res.message
    assert _flex().supports(dataclasses.replace(PAGED, layout=Layout.VARLEN, page_size=0)) \
        is None


def test_the_block_mask_is_kept_per_case_and_keyed_on_everything_that_changes_it(
        monkeypatch):
    from torch.nn.attention import flex_attention as fa

    built = []
    create = fa.create_block_mask

    def counting(*a, **kw):  # block_mask_for imports it from its module at every call
        built.append(a[2:5])
        return create(*a, **kw)

    monkeypatch.setattr(fa, "create_block_mask", counting)

    def mask_for(case: Case, inputs):
        return flex_masks.block_mask_for(
            inputs.q, inputs.k, mask_kind=case.mask.value, mask=inputs.mask,
            key_lengths=inputs.key_lengths, causal_offset=case.causal_offset,
            window=(case.window_left, case.window_right), layout=case.layout.value,
            serving=inputs.serving)

    first = mask_for(VARLEN_BR, make_inputs(VARLEN_BR))
    again = mask_for(VARLEN_BR, make_inputs(VARLEN_BR, draw=1))  # another input set
    assert again is first and len(built) == 1
    # the same case with another placement (seed) or window: built again
    for other in (dataclasses.replace(VARLEN_BR, seed=3),
                  dataclasses.replace(VARLEN_BR, window_left=4)):
        assert mask_for(other, make_inputs(other)) is not first
    assert len(built) == 3
    # packed tensors of one shape, two placements: two masks
    q, k = torch.zeros(1, 2, 10, 16), torch.zeros(1, 2, 12, 16)
    masks = []
    for cu_q, len_q in (([0, 5, 10], [5, 5]), ([0, 4, 10], [4, 6])):
        index = serving.ServingIndex(*(torch.tensor(x, dtype=torch.int32) for x in (
            len_q, [6, 6], cu_q, [0, 6, 12])))
        masks.append(flex_masks.block_mask_for(q, k, mask_kind="causal_br", mask=None,
                                               key_lengths=None, causal_offset=0,
                                               layout="varlen", serving=index))
    assert masks[0] is not masks[1] and len(built) == 5
    windowed = dataclasses.replace(DENSE_BR_WINDOW, window_left=11)
    assert mask_for(DENSE_BR_WINDOW, make_inputs(DENSE_BR_WINDOW)) is not \
        mask_for(windowed, make_inputs(windowed))
    # a random mask comes from the draw: never kept
    rnd = DENSE_MASKED_WINDOWS[1]
    n = len(built)
    mask_for(rnd, make_inputs(rnd))
    mask_for(rnd, make_inputs(rnd))
    assert len(built) == n + 2


# --- the Python protocol's serving keywords and varlen copy ------------------------------

def test_varlen_results_are_copied_into_the_sequence_rows_only():
    """A kernel's own result has every row written; the harness's padding rows keep their
    poison (copying everything would be 'written in the padding')."""
    seen = {}

    def fn(q, k, v, **kw):
        seen.update(kw)
        return torch.ones_like(q), torch.zeros(q.shape[:3], dtype=torch.float32)

    cand = to_candidate(PythonKernel(name="ones", fn=fn, device="cpu", lse="-inf",
                                     layouts=("dense", "varlen")), "test")
    case = VARLEN_BR
    inputs = make_inputs(case)
    bufs = OutputBuffers.allocate(case, "cpu", True)
    cand.run(case, inputs, bufs.out, bufs.lse)
    assert bufs.unwritten() is None and bufs.check_guards() is None
    valid = serving.row_valid(case)
    assert torch.all(bufs.out[:, :, valid] == 1) and torch.all(bufs.lse[:, :, valid] == 0)
    assert seen["layout"] == "varlen" and seen["serving"] is inputs.serving
    assert (seen["window_left"], seen["window_right"]) == (-1, -1)
    assert (seen["max_seqlen_q"], seen["max_seqlen_k"]) == (37, 53)


def test_kernels_without_serving_declarations_get_the_old_keywords_and_skip_serving():
    def strict(q, k, v, *, mask_kind, mask, key_lengths, causal_offset, scale):
        return torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), scale=scale).to(q.dtype)

    cand = to_candidate(PythonKernel(name="strict", fn=strict, device="cpu", masks=("none",),
                                     gqa=False), "test")
    assert check_case(cand, Case(1, 2, 2, 9, 13, 32), device="cpu").status is Status.PASSED
    assert cand.supports(Case(1, 2, 2, 9, 13, 32, layout=Layout.VARLEN)) == \
        "varlen layout not supported"
    assert cand.supports(Case(1, 2, 2, 9, 13, 32, window_left=3)) == \
        "sliding window not supported"
    bad = PythonKernel(name="bad", fn=strict, layouts=("varlen", "ragged"))
    assert any("layouts" in p for p in bad.problems())


def test_the_backward_of_a_serving_layout_is_skipped_with_the_reason():
    res = check_backward_case(_flex(), VARLEN_BR, device="cpu")
    assert res.status is Status.SKIPPED
    if _flex().support.backward:
        assert "varlen layout" in res.message


# --- the SDPA peers ----------------------------------------------------------------------

def _math() -> SdpaPeer:
    p = next(p for p in sdpa_peers() if p.name == "sdpa_math")
    return SdpaPeer(name="sdpa_math", kind="peer", device="cpu", backend="math",
                    support=p.support)


@pytest.mark.parametrize("case", [DENSE_BR_WINDOW, DENSE_TL_WINDOW, *DENSE_MASKED_WINDOWS,
                                  *DENSE_WINDOW_GRID[:6]], ids=lambda c: c.id)
def test_sdpa_math_takes_windows_as_a_boolean_mask(case):
    res = check_case(_math(), case, device="cpu")
    assert res.status is Status.PASSED, res.message


def test_sdpa_math_window_backward():
    res = check_backward_case(_math(), DENSE_TL_WINDOW, device="cpu")
    assert res.status is Status.PASSED, res.message


@pytest.mark.parametrize("case", [VARLEN_BR, PAGED], ids=lambda c: c.id)
def test_sdpa_peers_skip_varlen_and_paged_with_the_reason(case):
    for peer in sdpa_peers():
        reason = peer.supports(case)
        assert reason and reason.startswith(f"{peer.name}: SDPA has no"), reason
        assert case.layout.value in reason


def test_the_window_is_part_of_the_probed_signature(monkeypatch):
    calls = []
    real = SdpaPeer._try

    def counting(self, case, inputs, gqa_native):
        calls.append(case)
        return real(self, case, inputs, gqa_native)

    monkeypatch.setattr(SdpaPeer, "_try", counting)
    peer = _math()
    plain = dataclasses.replace(DENSE_BR_WINDOW, window_left=-1, window_right=-1)
    assert peer.supports(plain) is None and peer.supports(DENSE_BR_WINDOW) is None
    assert len(calls) == 2 and calls[1].has_window and calls[1].batch == 1
    assert peer.supports(dataclasses.replace(DENSE_BR_WINDOW, batch=5, seed=2)) is None
    assert len(calls) == 2  # batch and seed: the same signature


# --- on a GPU ----------------------------------------------------------------------------

@pytest.mark.gpu
def test_flex_serving_grid_gpu():
    """The compiled flex_attention on the serving grid: every dense-window and varlen
    case passes, every paged case is skipped with the reason."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from harness.execution.runner import run_correctness
    from harness.runs.gate_prepare import split_python

    results = run_correctness([_flex()], SERVING, parallel=3, split=split_python)
    bad = [f"{r.case.id}: {r.status.value}: {r.message}" for r in results
           if (r.status is not Status.PASSED) != (r.case.layout is Layout.PAGED)]
    assert not bad, "\n".join(bad)
    assert {r.message for r in results if r.case.layout is Layout.PAGED} == {flex.PAGED_REASON}


@pytest.mark.gpu
@pytest.mark.parametrize("case", [DENSE_BR_WINDOW, DENSE_TL_WINDOW], ids=lambda c: c.id)
def test_flex_window_backward_gpu(case):
    """The compiled backward differentiates the windowed forward: it passes the window
    case's backward check."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    res = check_backward_case(_flex(), case, device="cuda")
    assert res.status is Status.PASSED, res.message


@pytest.mark.gpu
def test_sdpa_window_cases_gpu():
    """On a GPU: sdpa_flash takes no mask, so a window is a skip that says so; the
    backends that take an arbitrary mask pass, or refuse with torch's reason."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    cases = DENSE_WINDOW_GRID + DENSE_MASKED_WINDOWS
    peers = {p.name: p for p in sdpa_peers()}
    lines = []
    for name, peer in peers.items():
        for case in cases:
            res = check_case(peer, case, device="cuda")
            lines.append(f"{name} {case.id}: {res.status.value}: {res.message}")
            if name == "sdpa_flash":
                assert res.status is Status.SKIPPED and "attn_mask" in res.message, lines[-1]
                assert res.message.startswith("sdpa_flash: sliding window as a boolean")
            elif name in ("sdpa_efficient", "sdpa_math"):
                assert res.status is Status.PASSED, lines[-1]
            else:  # cuDNN: a skip with its reason, or a run held to the check
                assert res.status in (Status.PASSED, Status.SKIPPED, Status.FAILED), lines[-1]
    print("\n".join(lines))
