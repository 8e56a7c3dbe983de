"""`[[flavor]]`: one variant folder built again with more `-D` options under another name
(fa2_mma_det, the deterministic backward) -- loading, validation, discovery and the
isolated paths that rebuild a variant from its folder (CPU only)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_variants import dump_toml, good_manifest, write_variant  # noqa: I001

from harness.candidates.variants import (
    KERNELS_ROOT,
    VariantError,
    load_specs,
    load_variant,
    load_variant_dir,
    load_variant_file,
)
from harness.execution.sanitize import command

FLAVOR = {"name": "v_det", "description": "ordered", "compile_options": ["-DV_DET"]}


def _with_backward(m: dict) -> dict:
    m = dict(m)
    m["backward"] = {"deterministic": False}
    return m


def _manifest_text(flavors: list[dict], backward: bool = True) -> str:
    text = dump_toml(good_manifest())
    if backward:
        text += ('\n[backward]\ndeterministic = false\n[[backward.launch]]\n'
                 'entry = "v_bwd_{dtype}"\ngrid = [1, 1, 1]\nblock = [32, 1, 1]\n')
    for f in flavors:
        text += "\n[[flavor]]\n" + dump_toml(f)
    return text


def _variant(tmp_path: Path, flavors: list[dict], backward: bool = True) -> Path:
    d = write_variant(tmp_path, good_manifest())
    (d / "manifest.toml").write_text(_manifest_text(flavors, backward))
    (d / "v.cu").write_text('#include "fa_harness.h"\n'
                            'extern "C" __global__ void v_fwd_fp16(FaParams p) {}\n'
                            'extern "C" __global__ void v_bwd_fp16(FaParams p) {}\n')
    return d


def test_shipped_fa2_mma_has_its_deterministic_flavor():
    base = load_variant_dir(KERNELS_ROOT / "fa2_mma")
    specs = base.with_flavors()
    assert [s.name for s in specs] == ["fa2_mma", "fa2_mma_det"]
    det = specs[1]
    assert det.compile_options == base.compile_options + ("-DFA2MMA_DETERMINISTIC",)
    assert base.backward is not None and not base.backward.deterministic
    assert det.backward is not None and det.backward.deterministic
    assert det.to_support().backward_deterministic
    assert not base.to_support().backward_deterministic
    # Same sources and launches, another compiled module.
    assert det.full_source() == base.full_source()
    assert det.source_hash != base.source_hash
    assert det.flavors == ()
    names = [s.name for s in load_specs()[0]]
    assert "fa2_mma_det" in names and names.count("fa2_mma") == 1


def test_the_order_counts_are_declared_and_linear_in_the_sequence():
    base = load_variant_dir(KERNELS_ROOT / "fa2_mma")
    ws = {w.name: w for w in base.pass_workspaces(backward=True)}
    env = {"batch": 2, "heads": 3, "seqlen_q": 100}
    assert ws["dq_order"].dtype == "int32"
    assert ws["dq_order"].elements.evaluate(env) == 2 * 3 * 7


def test_load_variant_by_flavor_name(tmp_path):
    d = _variant(tmp_path, [FLAVOR, dict(FLAVOR, name="v_big", compile_options=["-DBIG=2"],
                                         deterministic=False)])
    assert load_variant(d).name == "v"
    det = load_variant(d, "v_det")
    assert det.name == "v_det" and det.description == "ordered"
    assert det.compile_options == ("--use_fast_math", "-DV_DET")
    assert det.backward is not None and not det.backward.deterministic  # not overridden
    assert load_variant(d, "v_big").deterministic is False
    assert load_variant(d, "v").name == "v"
    with pytest.raises(VariantError, match="has no flavor 'v_other'"):
        load_variant(d, "v_other")


@pytest.mark.parametrize(("flavor", "message"), [
    (dict(FLAVOR, name="other_det"), "flavor\\[0\\].name: 'other_det' must be 'v' \\+ '_'"),
    (dict(FLAVOR, name="v_"), None),
    (dict(FLAVOR, colour="red"), "flavor\\[0\\].colour: unknown field"),
    ({"name": "v_det", "description": "x"}, "flavor\\[0\\].compile_options: missing"),
    (dict(FLAVOR, compile_options=["-I/etc"]), "flavor\\[0\\].compile_options\\[0\\]: option "
                                               "'-I/etc' is not allowed"),
    (dict(FLAVOR, compile_options=[]), "flavor\\[0\\].compile_options: must not be empty"),
    (dict(FLAVOR, deterministic="yes"), "flavor\\[0\\].deterministic: must be true or false"),
])
def test_bad_flavors_name_the_field(tmp_path, flavor, message):
    d = _variant(tmp_path, [flavor])
    if message is None:  # "v_" is a valid identifier with the prefix
        assert load_variant(d, "v_").name == "v_"
        return
    with pytest.raises(VariantError, match=message):
        load_variant_dir(d)


def test_flavor_declared_twice_and_backward_flag_without_backward(tmp_path):
    with pytest.raises(VariantError, match="flavor\\[1\\].name: 'v_det' is declared twice"):
        load_variant_dir(_variant(tmp_path / "a", [FLAVOR, FLAVOR]))
    with pytest.raises(VariantError, match="backward_deterministic: the variant declares no"):
        load_variant_dir(_variant(tmp_path / "b", [dict(FLAVOR, backward_deterministic=True)],
                                  backward=False))


def test_a_single_file_variant_has_no_flavor(tmp_path):
    f = tmp_path / "solo.cu"
    text = _manifest_text([FLAVOR], backward=False).replace('"v"', '"solo"', 1)
    text = text.replace('sources = ["v.cu"]\n', "").replace('name = "v_det"', 'name = "solo_d"')
    f.write_text("/* fa-harness manifest\n" + text + "*/\n" + '#include "fa_harness.h"\n'
                 'extern "C" __global__ void v_fwd_fp16(FaParams p) {}\n')
    with pytest.raises(VariantError, match="flavor: a single-file variant is one variant"):
        load_variant_file(f)


def test_discovery_enrols_flavors_and_refuses_to_submit_one(tmp_path, monkeypatch):
    from harness.candidates import discovery

    _variant(tmp_path / "kernels", [FLAVOR])
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "team"\n[tool.fa-harness]\nkernels-dirs = ["kernels"]\n')
    monkeypatch.delenv(discovery.ENV_KERNELS, raising=False)
    found = discovery.find_variants(tmp_path)
    names = [s.name for s, _ in found.specs]
    assert names[:2] == ["v", "v_det"] and "fa2_mma_det" in names
    assert discovery.variant_path("v", tmp_path) == tmp_path / "kernels" / "v"
    with pytest.raises(discovery.DiscoveryError, match="v_det is a \\[\\[flavor\\]\\] of v"):
        discovery.variant_path("v_det", tmp_path)


def test_isolated_children_rebuild_the_flavor(tmp_path):
    from harness.execution.isolate import build_candidate

    path = str(KERNELS_ROOT / "fa2_mma")
    cand = build_candidate("fa2_mma_det", {"variant_path": path})
    assert cand.name == "fa2_mma_det" and cand.support.backward_deterministic
    assert build_candidate("fa2_mma", {"variant_path": path}).name == "fa2_mma"
    # A name that is no flavor (a submission's id) builds the folder's variant.
    assert build_candidate("sub-17", {"variant_path": path}).name == "fa2_mma"
    cmd = command("compute-sanitizer", "memcheck", path, [], name="fa2_mma_det")
    assert cmd[cmd.index("--name") + 1] == "fa2_mma_det"
    assert "--name" not in command("compute-sanitizer", "memcheck", path, [])
