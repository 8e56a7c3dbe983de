"""A variant's `[backward]` table: parsed field by field, its entries compiled with the
forward's, its bad input one message naming the field; the backward's FaParams fields."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.candidates.cuda_candidate import CudaVariant
from harness.candidates.params import build_params, field_offsets
from harness.candidates.variants import VariantError, load_specs, load_variant_dir
from harness.core.cases import Case, MaskKind, make_inputs

HEAD = """name = "v"
description = "test variant"
algorithm = "fa2"
sources = ["v.cu"]
min_compute_capability = "8.0"

[supports]
dtypes = ["float16"]
head_dims = [64]
masks = ["none"]
gqa = true
writes_lse = true

[[launch]]
entry = "v_fwd_{dtype}"
grid = ["seqlen_q", "heads", "batch"]
block = [32, 1, 1]
"""

BACKWARD = """
[backward]
deterministic = true

[[backward.workspace]]
name = "dq_accum"
dtype = "float32"
elements = "batch * heads * seqlen_q * head_dim"

[[backward.launch]]
entry = "v_bwd_{dtype}"
grid = ["ceil_div(seqlen_k, 64)", "kv_heads", "batch"]
block = [128, 1, 1]
shared_mem = "64 * head_dim * 2"
"""

KERNEL = ('#include "fa_harness.h"\n'
          'extern "C" __global__ void v_fwd_fp16(FaParams p) {}\n'
          'extern "C" __global__ void v_bwd_fp16(FaParams p) {}\n')


def _variant(root: Path, manifest: str) -> Path:
    d = root / "v"
    d.mkdir(parents=True, exist_ok=True)
    (d / "manifest.toml").write_text(manifest)
    (d / "v.cu").write_text(KERNEL)
    return d


def _error(root: Path, manifest: str) -> str:
    with pytest.raises(VariantError) as info:
        load_variant_dir(_variant(root, manifest))
    return str(info.value)


def test_backward_table_is_parsed_and_its_entries_checked(tmp_path):
    spec = load_variant_dir(_variant(tmp_path, HEAD + BACKWARD))
    assert spec.backward is not None and spec.backward.deterministic
    assert [w.name for w in spec.backward.workspaces] == ["dq_accum"]
    assert spec.entry_names() == ["v_fwd_fp16", "v_bwd_fp16"]
    assert "FA_CHECK_ENTRY(v_bwd_fp16);" in spec.full_source()
    support = spec.to_support()
    assert support.backward and support.backward_deterministic
    cand = CudaVariant.from_spec(spec)
    case = Case(2, 4, 2, 100, 130, 64, "float16", MaskKind.NONE)
    cand.backward_pass = True
    (p,) = cand.plan(case, num_splits=1, sm_count=132)
    assert p.entry == "v_bwd_fp16" and p.grid == (3, 2, 2) and p.shared_mem == 64 * 64 * 2
    assert cand.workspace_sizes(case, num_splits=1, sm_count=132) == [2 * 4 * 100 * 64]
    cand.backward_pass = False
    assert [q.entry for q in cand.plan(case, num_splits=1, sm_count=132)] == ["v_fwd_fp16"]


def test_no_backward_table_means_no_backward(tmp_path):
    spec = load_variant_dir(_variant(tmp_path, HEAD))
    assert spec.backward is None and not spec.to_support().backward
    with pytest.raises(ValueError, match="declares no backward"):
        spec.pass_launches(backward=True)


@pytest.mark.parametrize(("extra", "fragment"), [
    ("\n[backward]\ndeterministic = false\n", "backward.launch: missing required field"),
    (BACKWARD.replace("deterministic = true", "deterministic = \"yes\""),
     "backward.deterministic"),
    (BACKWARD.replace("deterministic = true", "determinstic = true"), "backward"),
    (BACKWARD.replace('entry = "v_bwd_{dtype}"', 'entry = "v-bwd"'), "backward.launch[0].entry"),
    (BACKWARD.replace('dtype = "float32"', 'dtype = "float64"'),
     "backward.workspace[0].dtype: unknown dtype"),
    (BACKWARD.replace('"ceil_div(seqlen_k, 64)"', '"__import__(\'os\')"'),
     "backward.launch[0].grid"),
    ("\nbackward = 3\n", "backward"),
])
def test_bad_backward_tables_name_the_field(tmp_path, extra, fragment):
    # A top-level key must come before the tables.
    top = extra.startswith("\nbackward =")
    manifest = extra.lstrip("\n") + HEAD if top else HEAD + extra
    msg = _error(tmp_path, manifest)
    assert fragment in msg and "manifest.toml" in msg, msg
    assert "\n" not in msg.strip()


def test_fa2_mma_ships_a_backward():
    specs, errors = load_specs()
    assert errors == []
    spec = next(s for s in specs if s.name == "fa2_mma")
    assert spec.backward is not None and not spec.backward.deterministic  # dQ by atomics
    assert [launch.entry for launch in spec.backward.launches] == [
        "fa2_mma_bwd_pre_{dtype}_d{head_dim}", "fa2_mma_bwd_main_{dtype}_d{head_dim}",
        "fa2_mma_bwd_post_{dtype}_d{head_dim}"]
    assert "fa2_mma_bwd_main_bf16_d128" in spec.entry_names()


def test_backward_fields_of_the_parameter_block():
    case = Case(2, 4, 2, 33, 40, 64, "float16", MaskKind.NONE)
    inp = make_inputs(case)
    out = torch.empty(2, 4, 33, 64, dtype=torch.float16)
    lse = torch.empty(2, 4, 33)
    dout, dq = torch.randn(2, 4, 33, 64).half(), torch.empty(2, 4, 33, 64, dtype=torch.float16)
    dk, dv = (torch.empty(2, 2, 40, 64, dtype=torch.float16) for _ in range(2))
    bp = build_params(case, inp, out, lse, [], 1, (dout, dq, dk, dv))
    assert bp["dout"] == dout.data_ptr() and bp["dv"] == dv.data_ptr()
    assert (bp["dk_batch_stride"], bp["dk_head_stride"], bp["dk_row_stride"]) == dk.stride()[:3]
    assert bp["o"] == out.data_ptr()  # the forward's O, read by the backward
    assert build_params(case, inp, out, lse, [], 1)["dq"] == 0  # a forward launch: null
    with pytest.raises(ValueError, match="dk is"):
        build_params(case, inp, out, lse, [], 1, (dout, dq, dq, dv))
    assert field_offsets()["dout"] % 8 == 0


def test_a_submission_with_a_backward_is_validated_with_it():
    """Submissions may declare a backward, scored on its own board
    (tests/test_submit_backward*.py): validation keeps it, with its launches checked."""
    from harness.submissions.submit import validate

    got = validate({"manifest.toml": HEAD + BACKWARD, "v.cu": KERNEL}, compile_sources=False)
    assert "backward" in got.manifest
    # The backward's own launch limits were evaluated at the cases it is scored on.
    assert got.limits["backward"]["threads"] == 128
    assert got.limits["backward"]["cases_checked"] > 0
    assert "backward" not in validate({"manifest.toml": HEAD, "v.cu": KERNEL},
                                      compile_sources=False).limits
