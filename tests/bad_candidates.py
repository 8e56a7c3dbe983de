"""Python candidates that break the protocol in each way a real one can, next to one
that keeps it, for tests/test_python_candidates.py (`--candidate bad_candidates:...`)."""

from __future__ import annotations

import os

import torch

from harness.candidates.python_candidate import PythonKernel


def _sdpa(q, k, v, *, mask_kind, mask, key_lengths, causal_offset, scale):
    # The smoke case used with these has no mask and no GQA.
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                            scale=scale).to(q.dtype)


def _raises(q, k, v, **kw):
    raise RuntimeError("kernel launch failed: out of registers")


def _wrong_shape(q, k, v, **kw):
    return _sdpa(q, k, v, **kw)[:, :, :-1]


def _wrong_dtype(q, k, v, **kw):
    return _sdpa(q, k, v, **kw).float()


def _no_lse(q, k, v, **kw):
    return _sdpa(q, k, v, **kw)


def _crashes(q, k, v, **kw):
    os._exit(7)  # a native crash as the harness sees it: the process is gone


good = PythonKernel(name="good_sdpa", fn=_sdpa, device="cpu", masks=("none",))
raises = PythonKernel(name="bad_raises", fn=_raises, device="cpu")
wrong_shape = PythonKernel(name="bad_shape", fn=_wrong_shape, device="cpu")
wrong_dtype = PythonKernel(name="bad_dtype", fn=_wrong_dtype, device="cpu")
missing_lse = PythonKernel(name="bad_no_lse", fn=_no_lse, device="cpu", lse="-inf")
crashes = PythonKernel(name="bad_crash", fn=_crashes, device="cpu")
invalid = PythonKernel(name="bad decl", fn=_sdpa, device="tpu", dtypes=("float64",))  # type: ignore[arg-type]
