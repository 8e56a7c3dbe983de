"""Manifest loading and validation, the memory-growth rule, and launch planning (CPU only)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from harness.candidates.cuda_candidate import (
    CudaVariant,
    DeviceLimits,
    PlannedLaunch,
    load_variants,
)
from harness.candidates.tensor_map import TensorMapError
from harness.candidates.variants import (
    KERNELS_ROOT,
    VariantError,
    load_specs,
    load_variant,
    load_variant_dir,
    load_variant_file,
    size_env,
)
from harness.core.cases import Case, MaskKind
from harness.core.fp8 import stored_bytes

DATA = Path(__file__).parent / "data" / "bad_variants"
SHIPPED = ("fa1", "fa2_simt", "naive", "splitkv", "template")


# ------------------------------------------------------------------ a small TOML writer

def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(v)


def dump_toml(d: dict) -> str:
    lines = [f"{k} = {_toml_value(v)}" for k, v in d.items()
             if not isinstance(v, dict) and not (isinstance(v, list) and v and isinstance(v[0], dict))]
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(f"\n[{k}]")
            lines += [f"{kk} = {_toml_value(vv)}" for kk, vv in v.items()]
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for item in v:
                lines.append(f"\n[[{k}]]")
                lines += [f"{kk} = {_toml_value(vv)}" for kk, vv in item.items()]
    return "\n".join(lines) + "\n"


KERNEL = '#include "fa_harness.h"\nextern "C" __global__ void v_fwd_fp16(FaParams p) {}\n'


def good_manifest(name: str = "v") -> dict:
    return {
        "name": name,
        "description": "test variant",
        "algorithm": "fa2",
        "sources": ["v.cu"],
        "min_compute_capability": "8.0",
        "compile_options": ["--use_fast_math"],
        "supports": {"dtypes": ["float16"], "head_dims": [64], "masks": ["none", "causal_br"],
                     "gqa": True, "writes_lse": True},
        "tiles": {"block_q": 64},
        "launch": [{"entry": "v_fwd_{dtype}", "grid": ["ceil_div(seqlen_q, block_q)", "heads",
                                                       "batch"],
                    "block": [128, 1, 1], "shared_mem": "block_q * head_dim * 4"}],
    }


def write_variant(root: Path, manifest: dict, *, folder: str | None = None,
                  kernel: str = KERNEL) -> Path:
    d = root / (folder or manifest.get("name", "v"))
    d.mkdir(parents=True, exist_ok=True)
    (d / "manifest.toml").write_text(dump_toml(manifest))
    (d / "v.cu").write_text(kernel)
    return d


def load_error(root: Path, manifest: dict, **kw) -> str:
    with pytest.raises(VariantError) as info:
        load_variant_dir(write_variant(root, manifest, **kw))
    return str(info.value)


# ------------------------------------------------------------------ shipped variants

def test_shipped_variants_load_without_errors():
    variants, errors = load_variants()
    assert errors == []
    names = {v.name for v in variants}
    assert set(SHIPPED) <= names
    for v in variants:
        assert v.kind == "cuda" and v.device == "cuda" and v.isolate
        assert v.meta["source_hash"] and v.meta["entries"]


def test_full_source_inlines_header_and_checks_every_entry():
    spec = load_variant_dir(KERNELS_ROOT / "fa2_simt")
    src = spec.full_source()
    assert '#line 1 "fa_harness.h"' in src and '#line 1 "fa2_simt/fa2_simt.cu"' in src
    assert "struct FaParams" in src
    assert '#include "fa_harness.h"' not in src  # inlined, so the cache key covers it
    entries = spec.entry_names()
    assert len(entries) == 2 * len(spec.supports.head_dims)
    assert "fa2_simt_fwd_bf16_d111" in entries
    for e in entries:
        assert f"FA_CHECK_ENTRY({e});" in src


def test_source_hash_changes_with_source(tmp_path):
    d = write_variant(tmp_path, good_manifest())
    h1 = load_variant_dir(d).source_hash
    (d / "v.cu").write_text(KERNEL + "// changed\n")
    assert load_variant_dir(d).source_hash != h1


def test_support_mapping():
    spec = load_variant_dir(KERNELS_ROOT / "splitkv")
    s = spec.to_support()
    assert s.decode_only and s.head_dims == frozenset({64, 128})
    assert s.masks == frozenset(MaskKind)
    cand = CudaVariant.from_spec(spec)
    assert cand.supports(Case(1, 32, 8, 1, 4096, 128)) is None
    assert "head_dim" in cand.supports(Case(1, 4, 4, 1, 64, 96))
    assert "decode" in cand.supports(Case(1, 4, 4, 1000, 1000, 64))
    tpl = CudaVariant.from_spec(load_variant_dir(KERNELS_ROOT / "template"))
    assert tpl.support.head_dims is None
    assert tpl.supports(Case(1, 1, 1, 3, 3, 256)) is None
    assert "256" in tpl.supports(Case(1, 1, 1, 3, 3, 288))


# ------------------------------------------------------------------ memory-growth rule

def _growth(spec, ws) -> float:
    """How a workspace grows when both sequence lengths grow 4x (splits fixed)."""
    small = Case(2, 8, 2, 512, 512, 128)
    big = Case(2, 8, 2, 2048, 2048, 128)
    e1 = ws.elements.evaluate(size_env(small, num_splits=8, tiles=spec.tiles))
    e2 = ws.elements.evaluate(size_env(big, num_splits=8, tiles=spec.tiles))
    return e2 / max(e1, 1)


def _quadratic(spec) -> list[str]:
    return [w.name for w in spec.workspaces if _growth(spec, w) > 4.0 + 1e-9]


def test_memory_growth_rule_over_every_manifest():
    specs, errors = load_specs()
    assert errors == []
    for spec in specs:
        quadratic = _quadratic(spec)
        if not spec.algorithm.startswith("naive_"):
            assert quadratic == [], (f"{spec.name}: workspace(s) {quadratic} grow with "
                                     "Nq x Nk; only naive_* variants may")


def test_memory_growth_rule_detects_quadratic_workspaces():
    spec = load_variant_dir(KERNELS_ROOT / "naive")
    assert _quadratic(spec) == ["scores", "probs"]
    splitkv = load_variant_dir(KERNELS_ROOT / "splitkv")
    assert _quadratic(splitkv) == []
    # linear in the split count too: splits x rows x d
    ws = splitkv.workspaces[0]
    c = Case(1, 32, 8, 1, 8192, 128)
    assert ws.elements.evaluate(size_env(c, num_splits=16, tiles=splitkv.tiles)) == 16 * 32 * 128


# ------------------------------------------------------------------ bad variants on disk

@pytest.mark.parametrize("folder, where, fragment", [
    ("missing_field", "algorithm", "missing required field"),
    ("unknown_field", "supports.colour", "unknown field"),
    ("unknown_size", "launch[0].grid[0]", "'seq_len'"),
    ("unknown_mask", "supports.masks[1]", "sliding_window"),
    ("too_many_workspaces", "workspace", "at most 4"),
])
def test_bad_manifests_name_file_and_field(folder, where, fragment):
    with pytest.raises(VariantError) as info:
        load_variant_dir(DATA / folder)
    msg = str(info.value)
    assert str(DATA / folder / "manifest.toml") in msg
    assert f": {where}: " in msg
    assert fragment in msg


def test_bad_include_names_source_and_line():
    with pytest.raises(VariantError) as info:
        load_variant_dir(DATA / "bad_include")
    msg = str(info.value)
    assert str(DATA / "bad_include" / "kernel.cu") in msg
    assert "line 1" in msg and "<stdio.h>" in msg


def test_one_bad_variant_does_not_stop_the_others(tmp_path):
    write_variant(tmp_path, good_manifest("good"))
    bad = good_manifest("bad")
    del bad["algorithm"]
    write_variant(tmp_path, bad)
    (tmp_path / "include").mkdir()  # not a variant
    variants, errors = load_variants(tmp_path)
    assert [v.name for v in variants] == ["good"]
    assert len(errors) == 1 and errors[0].variant == "bad" and errors[0].where == "algorithm"


def test_compile_level_bad_variants_still_load():
    # These fail only when compiled (tests/test_compile_nvcc.py); the loader accepts them.
    for folder in ("does_not_compile", "missing_entry", "wrong_signature"):
        assert load_variant_dir(DATA / folder).name == folder


# ------------------------------------------------------------------ validation, field by field

def _mut(path: str, value, delete: bool = False) -> dict:
    m = good_manifest()
    keys = path.split(".")
    target = m
    for k in keys[:-1]:
        target = target[int(k)] if isinstance(target, list) else target[k]
    if delete:
        del target[keys[-1]]
    elif isinstance(target, list):
        target[int(keys[-1])] = value
    else:
        target[keys[-1]] = value
    return m


@pytest.mark.parametrize("path, value, where, fragment", [
    ("name", 3, "name", "must be a string"),
    ("name", "has space", "name", "letters, digits"),
    ("algorithm", "flash3", "algorithm", "unknown algorithm"),
    ("description", ["x"], "description", "must be a string"),
    ("sources", "v.cu", "sources", "must be a list"),
    ("sources", [], "sources", "must not be empty"),
    ("sources", ["../v.cu"], "sources[0]", "inside the variant folder"),
    ("sources", ["missing.cu"], "sources[0]", "not found"),
    ("min_compute_capability", "80", "min_compute_capability", "8.0"),
    ("min_compute_capability", 8.0, "min_compute_capability", "must be a string"),
    ("arch", "sm90", "arch", "sm_90a"),
    ("compile_options", ["-I/etc"], "compile_options[0]", "not allowed"),
    ("compile_options", ["--pre-include=x.h"], "compile_options[0]", "not allowed"),
    ("compile_options", "--use_fast_math", "compile_options", "must be a list"),
    ("deterministic", "yes", "deterministic", "true or false"),
    ("num_splits", 2, "num_splits", "only split-KV"),
    ("supports.gqa", "yes", "supports.gqa", "true or false"),
    ("supports.dtypes", ["float32"], "supports.dtypes[0]", "unknown dtype"),
    ("supports.head_dims", "all", "supports.head_dims", "list of integers"),
    ("supports.head_dims", [64, 0], "supports.head_dims[1]", ">= 1"),
    ("supports.head_dims", [512], "supports.head_dims[0]", "> 256"),
    ("supports.head_dims", "any", "supports.max_head_dim", "required"),
    ("supports.masks", ["none", "causal"], "supports.masks[1]", "unknown mask kind"),
    ("supports.masked_lse", "nan", "supports.masked_lse", "-inf"),
    ("supports.max_seqlen_q", 0, "supports.max_seqlen_q", ">= 1"),
    ("supports.shape", 1, "supports.shape", "unknown field"),
    ("supports.softcap", "yes", "supports.softcap", "true or false"),
    ("supports.sinks", 1, "supports.sinks", "true or false"),
    ("supports.fp8", 1, "supports.fp8", "true or false"),
    ("supports.fp8_kv", "no", "supports.fp8_kv", "true or false"),
    ("tiles.block_q", 0, "tiles.block_q", ">= 1"),
    ("tiles.block_q", "64", "tiles.block_q", "must be an integer"),
    ("tiles.heads", 4, "tiles.heads", "not size names"),
    ("launch", [], "launch", "must not be empty"),
    ("launch.0.entry", "bad-name", "launch[0].entry", "identifier"),
    ("launch.0.entry", "v_{arch}", "launch[0].entry", "identifier"),
    ("launch.0.grid", ["1", "2", "3", "4"], "launch[0].grid", "at most 3"),
    ("launch.0.grid", ["batch ** 2"], "launch[0].grid[0]", "Pow"),
    ("launch.0.block", [128.0], "launch[0].block[0]", "expected an integer"),
    ("launch.0.shared_mem", "block_q * head_size", "launch[0].shared_mem", "'head_size'"),
    ("launch.0.stream", 1, "launch[0].stream", "unknown field"),
])
def test_field_validation(tmp_path, path, value, where, fragment):
    msg = load_error(tmp_path, _mut(path, value), folder="v")
    assert str(tmp_path / "v" / "manifest.toml") in msg
    assert f": {where}: " in msg, msg
    assert fragment in msg, msg


@pytest.mark.parametrize("path, where", [
    ("name", "name"), ("supports", "supports"), ("launch", "launch"),
    ("supports.masks", "supports.masks"), ("launch.0.entry", "launch[0].entry"),
    ("launch.0.grid", "launch[0].grid"),
])
def test_missing_fields(tmp_path, path, where):
    msg = load_error(tmp_path, _mut(path, None, delete=True), folder="v")
    assert f": {where}: missing required field" in msg


def test_other_validation_rules(tmp_path):
    m = good_manifest()
    m["name"] = "other"
    assert "must equal the folder name 'v'" in load_error(tmp_path / "a", m, folder="v")
    m = good_manifest()
    m["supports"]["head_dims"] = "any"
    m["supports"]["max_head_dim"] = 128
    m["launch"][0]["entry"] = "v_fwd_{dtype}_d{head_dim}"
    assert "{head_dim}" in load_error(tmp_path / "b", m)
    m = good_manifest()
    m["workspace"] = [{"name": "w", "dtype": "float64", "elements": "batch"}]
    assert "workspace[0].dtype: unknown dtype" in load_error(tmp_path / "c", m)
    m = good_manifest()
    m["workspace"] = [{"name": "w", "dtype": "float32", "elements": "batch"},
                      {"name": "w", "dtype": "float32", "elements": "batch"}]
    assert "workspace[1].name" in load_error(tmp_path / "d", m)
    m = good_manifest()
    m["workspace"] = [{"name": "w", "dtype": "float32"}]
    assert "workspace[0].elements: missing required field" in load_error(tmp_path / "e", m)
    d = tmp_path / "f" / "v"
    d.mkdir(parents=True)
    (d / "manifest.toml").write_text('name = "v"\nalgorithm = \n')
    with pytest.raises(VariantError, match="not valid TOML"):
        load_variant_dir(d)
    with pytest.raises(VariantError, match="manifest.toml not found"):
        load_variant_dir(tmp_path / "nothing")


def test_splitkv_num_splits_accepted(tmp_path):
    m = good_manifest()
    m["algorithm"] = "splitkv"
    m["num_splits"] = 0
    spec = load_variant_dir(write_variant(tmp_path, m))
    assert spec.num_splits == 0
    m["num_splits"] = -1
    assert "num_splits: must be >= 0" in load_error(tmp_path / "x", m)


def test_new_case_axes_accepted_as_false(tmp_path):
    # Score modifiers, head_dim_v and fp8 (docs/score-mods.md, docs/fp8.md): `false` loads,
    # `true` is refused (test_field_validation); the variant then skips those cases.
    m = good_manifest()
    m["supports"].update(dict.fromkeys(("softcap", "head_dim_v", "fp8", "fp8_kv"), False))
    load_variant_dir(write_variant(tmp_path, m))


# ------------------------------------------------------------------ single-file variants

SINGLE = """/* fa-harness manifest
name = "solo"
description = "single-file submission"
algorithm = "fa2"
min_compute_capability = "8.0"

[supports]
dtypes = ["float16", "bfloat16"]
head_dims = [64]
masks = ["none"]
gqa = false
writes_lse = false

[[launch]]
entry = "solo_{dtype}"
grid = ["seqlen_q", "heads", "batch"]
block = [32, 1, 1]
*/
#include "fa_harness.h"
extern "C" __global__ void solo_fp16(FaParams p) {}
extern "C" __global__ void solo_bf16(FaParams p) {}
"""


def test_single_file_variant(tmp_path):
    f = tmp_path / "anything.cu"
    f.write_text(SINGLE)
    spec = load_variant_file(f)
    assert spec.name == "solo" and spec.sources == ("anything.cu",)
    assert spec.entry_names() == ["solo_fp16", "solo_bf16"]
    assert load_variant(f).name == "solo"
    assert "solo_bf16(FaParams p)" in spec.full_source()


def test_single_file_errors(tmp_path):
    f = tmp_path / "x.cu"
    f.write_text('#include "fa_harness.h"\n')
    with pytest.raises(VariantError, match="line 1: no manifest"):
        load_variant_file(f)
    f.write_text(SINGLE.replace('algorithm = "fa2"\n', ""))
    with pytest.raises(VariantError, match=": algorithm: missing required field"):
        load_variant_file(f)
    f.write_text(SINGLE.replace('#include "fa_harness.h"', "#include <cuda_fp16.h>"))
    with pytest.raises(VariantError) as info:
        load_variant_file(f)
    line = SINGLE.splitlines().index('#include "fa_harness.h"') + 1
    assert f"x.cu: line {line}: " in str(info.value) and "<cuda_fp16.h>" in str(info.value)
    f.write_text(SINGLE.replace('algorithm = "fa2"', 'algorithm = "fa2"\nsources = ["y.cu"]'))
    with pytest.raises(VariantError, match="its own source"):
        load_variant_file(f)


def test_copied_template_enrols_by_folder(tmp_path):
    """Adding a folder is all it takes: a copy of the template (renamed) loads."""
    root = tmp_path / "kernels"
    shutil.copytree(KERNELS_ROOT / "template", root / "mine")
    man = (root / "mine" / "manifest.toml").read_text().replace('name = "template"',
                                                                'name = "mine"')
    (root / "mine" / "manifest.toml").write_text(man)
    variants, errors = load_variants(root)
    assert errors == [] and [v.name for v in variants] == ["mine"]


# ------------------------------------------------------------------ launch planning

def _cand(name: str) -> CudaVariant:
    return CudaVariant.from_spec(load_variant_dir(KERNELS_ROOT / name))


def test_plan_fa2_simt_odd_shape():
    c = _cand("fa2_simt")
    case = Case(2, 4, 4, 113, 203, 59, "bfloat16", MaskKind.CAUSAL_BR)
    (p,) = c.plan(case, num_splits=1, sm_count=132)
    assert p.entry == "fa2_simt_fwd_bf16_d59"
    assert p.grid == (2, 4, 2) and p.block == (128, 1, 1)
    assert p.shared_mem == ((64 + 32) * 68 + 32 * 64 + 64 * 32) * 4


def test_plan_splitkv_decode_and_single_split():
    c = _cand("splitkv")
    case = Case(1, 32, 8, 1, 131072, 128)
    n = c.resolve_num_splits(case, 132)
    assert 1 < n <= 128
    # One launch: the last split of each row chunk combines (SK_FUSED_COMBINE); the
    # e4m3-cache entry's grid is zero (skipped) for a 2-byte cache.
    partial, fp8 = c.plan(case, num_splits=n, sm_count=132)
    assert fp8.grid[0] == 0 and fp8.entry.startswith("splitkv_partial8_")
    assert partial.grid == (n, 8, 1)  # one block per (split, kv head): GQA group together
    assert partial.grid[0] * partial.grid[1] >= 132  # enough blocks to fill the SMs
    assert "-DSK_FUSED_COMBINE=1" in c.spec.compile_options
    # partial O, partial LSE, one ticket counter per (sequence, kv head, row chunk)
    assert c.workspace_sizes(case, num_splits=n, sm_count=132) == [n * 32 * 128, n * 32, 8]
    # GQA group of 8 at Nq = 3: 24 rows -> 2 row chunks of 16 per kv head
    p2, _ = c.plan(Case(1, 16, 2, 3, 100, 64), num_splits=2, sm_count=132)
    assert p2.grid == (2, 4, 1)
    assert c.workspace_sizes(Case(3, 16, 2, 3, 100, 64), num_splits=2, sm_count=132)[2] == 12


def test_resolve_num_splits():
    c = _cand("splitkv")
    big = Case(8, 32, 32, 1, 1024, 128)
    assert c.resolve_num_splits(big, 132) == 1  # enough (batch, head) blocks already
    assert _cand("fa2_simt").resolve_num_splits(big, 132) == 1
    spec = load_variant_dir(KERNELS_ROOT / "splitkv")
    forced = CudaVariant.from_spec(dataclasses.replace(spec, num_splits=5))
    assert forced.resolve_num_splits(big, 132) == 5
    assert forced.tiles["num_splits"] == 5


def test_check_limits():
    lim = DeviceLimits(sm_count=132, max_shared_optin=227 * 1024, compute_capability=(9, 0))
    ok = PlannedLaunch("k", (10, 1, 1), (128, 1, 1), 1000)
    assert CudaVariant.check_limits(ok, lim) is None
    assert "grid[1]" in CudaVariant.check_limits(PlannedLaunch("k", (1, 70000, 1), (32, 1, 1), 0), lim)
    assert "block[0]" in CudaVariant.check_limits(PlannedLaunch("k", (1, 1, 1), (2048, 1, 1), 0), lim)
    assert "threads per block" in CudaVariant.check_limits(
        PlannedLaunch("k", (1, 1, 1), (512, 4, 1), 0), lim)
    msg = CudaVariant.check_limits(PlannedLaunch("k", (1, 1, 1), (32, 1, 1), 230 * 1024), lim)
    assert "shared memory" in msg and str(227 * 1024) in msg
    assert "shared memory" in CudaVariant.check_limits(ok, lim, static_smem=227 * 1024)
    assert "threads" in CudaVariant.check_limits(ok, lim, max_threads=64)


def test_every_shipped_plan_fits_an_h200():
    """Every supported case of the smoke grid and the decode shapes plans within limits."""
    lim = DeviceLimits(sm_count=132, max_shared_optin=227 * 1024, compute_capability=(9, 0))
    cases = [Case(2, 4, 4, 113, 203, d, dt, m) for d in (40, 59, 64, 96, 111, 128)
             for dt in ("float16", "bfloat16") for m in MaskKind]
    cases += [Case(1, 32, 8, 1, nk, 128) for nk in (8192, 65536, 131072)]
    cases += [Case(4, 16, 16, 4096, 4096, 128), Case(1, 32, 32, 16384, 16384, 64)]
    for name in SHIPPED:
        c = _cand(name)
        for case in cases:
            if c.supports(case):
                continue
            n = c.resolve_num_splits(case, 132)
            for p in c.plan(case, num_splits=n, sm_count=132):
                if not p.skipped:
                    assert c.check_limits(p, lim) is None, (name, case.id, p)


def test_a_variant_declares_the_score_modifiers_and_dv_it_runs(tmp_path):
    """FaParams carries softcap, the ALiBi slopes, the sink logits and d_v: a variant
    declaring them runs those cases, the others are skipped with the reason."""
    m = good_manifest()
    m["supports"].update(softcap=True, sinks=True, head_dim_v=True, head_dims=[64, 128])
    cand = CudaVariant.from_spec(load_variant_dir(write_variant(tmp_path, m)))
    s = cand.support
    assert (s.softcap, s.sinks, s.head_dim_v, s.alibi) == (True, True, True, False)
    assert cand.supports(Case(1, 2, 2, 16, 16, 64, softcap=30.0, sinks=True)) is None
    assert cand.supports(Case(1, 2, 2, 16, 16, 128, head_dim_v=64)) is None
    assert "alibi" in cand.supports(Case(1, 2, 2, 16, 16, 64, alibi=True))
    plain = CudaVariant.from_spec(load_variant_dir(write_variant(tmp_path / "p", good_manifest())))
    assert "softcap" in plain.supports(Case(1, 2, 2, 16, 16, 64, softcap=30.0))
    assert "d_v" in plain.supports(Case(1, 2, 2, 16, 16, 64, head_dim_v=32))


def test_a_variant_declares_the_fp8_inputs_it_reads(tmp_path):
    """FaParams carries an fp8 case's descales: a variant declaring fp8 runs e4m3 Q, K, V
    cases, one declaring fp8_kv e4m3 caches; the others are skipped with the reason. A
    variant with tensor maps may declare them: an e4m3 tensor's map has 1-byte elements,
    so a box of 128 columns fits the 128-byte swizzle (2-byte ones need 64)."""
    m = good_manifest()
    m["supports"].update(fp8=True)
    cand = CudaVariant.from_spec(load_variant_dir(write_variant(tmp_path, m)))
    qkv = Case.from_id("b2h4k2-13x21-d64-fp16-causal_br-fp8_qkv_head")
    cache = Case.from_id("b2h4k2-1x21-d64-fp16-none-fp8_kv_token")
    assert cand.supports(qkv) is None
    assert "fp8 KV cache not supported" in cand.supports(cache)
    m["supports"].update(fp8=False, fp8_kv=True)
    kv = CudaVariant.from_spec(load_variant_dir(write_variant(tmp_path / "kv", m)))
    assert kv.supports(cache) is None and "fp8 q/k/v not supported" in kv.supports(qkv)
    m["tensor_map"] = [{"tensor": "q", "box_rows": 64, "box_cols": "64 * (1 + fp8_qkv)",
                        "swizzle": 128}]
    m["supports"].update(fp8=True)
    tm = CudaVariant.from_spec(load_variant_dir(write_variant(tmp_path / "tm", m, folder="v")))
    (tensor, box), = tm.tensor_map_boxes(qkv, num_splits=1, sm_count=132)
    assert (tensor, box.cols) == ("q", 128)
    box.check(stored_bytes(qkv)[0])        # e4m3 Q: 128 bytes a row
    with pytest.raises(TensorMapError, match="wider than its 128-byte swizzle"):
        box.check(stored_bytes(cache)[0])  # Q in fp16 (a cache case)
