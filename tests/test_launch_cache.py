"""The launch cache's keys, on the CPU: what makes a cached parameter block reusable (the
GPU half, bitwise against the uncached path, is in tests/test_cuda_variants_gpu.py)."""

from __future__ import annotations

import torch

from harness.candidates.cuda_candidate import CudaVariant
from harness.candidates.launch_state import PreparedParams, param_sources, tensor_key
from harness.core.cases import Case, MaskKind, make_inputs


def test_key_changes_with_any_address_or_stride_and_with_the_mask_object():
    case = Case(1, 2, 2, 8, 16, 16, "float16", MaskKind.RANDOM)
    a = make_inputs(case)
    out = torch.empty(1, 2, 8, 16, dtype=torch.float16)
    k1 = tensor_key(a, out, None)
    assert tensor_key(a, out, None) == k1
    assert tensor_key(a, torch.empty_like(out), None) != k1
    b = make_inputs(case, draw=1)
    assert tensor_key(b, out, None) != k1
    t = out.transpose(2, 3).contiguous().transpose(2, 3)  # other strides
    assert tensor_key(a, t, None) != k1


def test_a_prepared_block_is_stale_when_the_mask_changes():
    case = Case(1, 2, 2, 8, 16, 16, "float16", MaskKind.RANDOM)
    a = make_inputs(case)
    p = PreparedParams(params=None, copies=[], sources=(a.mask,), versions=(a.mask._version,),
                  cacheable=True)
    assert p.fresh(a)
    a.mask.logical_not_()  # in place
    assert not p.fresh(a)
    b = make_inputs(case)
    assert not p.fresh(b)  # another tensor, even with equal contents


def test_a_block_built_from_slopes_sinks_or_descales_is_fresh_until_they_change():
    """Each per-head or descale tensor the block was filled from is a source: the same
    tensors unchanged serve the cached block (a timing loop over an ALiBi, sink or fp8
    case must not rebuild it at every launch); new contents or another tensor do not."""
    for cid, name in (("b1h2-8x16-d16-fp16-none-alibi", "alibi_slopes"),
                      ("b1h2-8x16-d16-fp16-none-sink", "sinks"),
                      ("b1h2-8x16-d16-fp16-none-fp8_qkv_head", "k_descale")):
        case = Case.from_id(cid)
        a = make_inputs(case)
        src = param_sources(a)
        assert any(t is getattr(a, name) for t in src)
        p = PreparedParams(params=None, copies=[], sources=src,
                           versions=tuple(t._version for t in src), cacheable=True)
        assert p.fresh(a), cid
        getattr(a, name).mul_(2.0)  # in place
        assert not p.fresh(a), cid
        assert not p.fresh(make_inputs(case)), cid


def test_cache_is_on_by_default():
    from harness.candidates.registry import discover

    variants = [c for c in discover() if isinstance(c, CudaVariant)]
    assert variants and all(v.cache_launches for v in variants)


def test_the_function_handle_is_found_behind_a_rawkernel():
    from types import SimpleNamespace

    from harness.candidates.launch_state import function_ptr

    assert function_ptr(SimpleNamespace(ptr=1234)) == 1234  # cupy.cuda.Function
    assert function_ptr(SimpleNamespace(kernel=SimpleNamespace(ptr=99))) == 99  # RawKernel
    assert function_ptr(SimpleNamespace()) is None
