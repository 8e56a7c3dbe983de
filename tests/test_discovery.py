"""Discovery of the team's kernel folders (harness.candidates.discovery): search order,
origins, single-file variants, a name defined twice, folders that do not exist, and the
configuration reaching child processes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.candidates import discovery, registry
from harness.candidates.variants import KERNELS_ROOT

SINGLE = """/* fa-harness manifest
name = "{name}"
description = "single-file copy of the template"
algorithm = "fa2"
min_compute_capability = "8.0"
[supports]
dtypes = ["float16"]
head_dims = "any"
max_head_dim = 256
masks = ["none"]
gqa = true
writes_lse = true
[[launch]]
entry = "template_fwd_{{dtype}}"
grid = ["ceil_div(seqlen_q, 4)", "heads", "batch"]
block = [128, 1, 1]
*/
"""


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    """Each test starts with no configuration, in an empty directory, with fresh caches."""
    monkeypatch.delenv(discovery.ENV_KERNELS, raising=False)
    monkeypatch.delenv(discovery.ENV_CONFIG, raising=False)
    monkeypatch.setattr(discovery, "_config", discovery.Config())
    monkeypatch.chdir(tmp_path)
    registry.clear_cache()
    yield
    registry.clear_cache()


def variant(root: Path, name: str) -> Path:
    """A copy of the shipped template under another name."""
    dst = root / name
    shutil.copytree(KERNELS_ROOT / "template", dst)
    man = dst / "manifest.toml"
    man.write_text(man.read_text().replace('name = "template"', f'name = "{name}"'))
    return dst


def single_file(root: Path, name: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    src = (KERNELS_ROOT / "template" / "template.cu").read_text()
    f = root / f"{name}.cu"
    f.write_text(SINGLE.format(name=name) + src)
    return f


def origins() -> dict[str, str]:
    return {c.name: registry.origin(c) for c in registry.discover(("cuda",))}


def test_order_cli_env_pyproject_shipped(tmp_path, monkeypatch):
    cli, env, proj = tmp_path / "cli", tmp_path / "env", tmp_path / "proj"
    variant(cli, "from_cli")
    variant(env, "from_env")
    variant(proj, "from_proj")
    (tmp_path / "pyproject.toml").write_text('[tool.fa-harness]\nkernels-dirs = ["proj"]\n')
    monkeypatch.setenv(discovery.ENV_KERNELS, str(env))
    discovery.configure([str(cli)])
    dirs = discovery.kernel_dirs()
    assert [d.origin for d in dirs] == [
        "--kernels-dir", "FA_HARNESS_KERNELS",
        f"pyproject.toml ({tmp_path / 'pyproject.toml'})", "shipped"]
    assert [d.path for d in dirs[:3]] == [cli, env, proj]
    found = origins()
    assert found["from_cli"].startswith("--kernels-dir: ")
    assert found["from_env"].startswith("FA_HARNESS_KERNELS: ")
    assert found["from_proj"].startswith("pyproject.toml (")
    assert found["template"].startswith("shipped: ")


def test_pyproject_of_a_parent_directory(tmp_path, monkeypatch):
    variant(tmp_path / "kernels", "mine")
    (tmp_path / "pyproject.toml").write_text('[tool.fa-harness]\nkernels-dirs = ["kernels"]\n')
    sub = tmp_path / "src" / "deep"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    assert "mine" in origins()


def test_single_file_variants_are_found(tmp_path):
    single_file(tmp_path / "k", "one_file")
    discovery.configure([str(tmp_path / "k")])
    assert origins()["one_file"].endswith("one_file.cu")


def test_same_name_twice_is_one_error_naming_both(tmp_path):
    a = variant(tmp_path / "a", "dup")
    b = variant(tmp_path / "b", "dup")
    discovery.configure([str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(discovery.DiscoveryError) as info:
        registry.discover(("cuda",))
    msg = str(info.value)
    assert "'dup' is defined twice" in msg and str(a) in msg and str(b) in msg
    assert "\n" not in msg


def test_a_shipped_name_reused_by_the_team_is_an_error(tmp_path):
    variant(tmp_path / "k", "template")
    discovery.configure([str(tmp_path / "k")])
    with pytest.raises(discovery.DiscoveryError, match="'template' is defined twice"):
        registry.discover(("cuda",))


def test_missing_folders_are_errors(tmp_path, monkeypatch):
    with pytest.raises(discovery.DiscoveryError, match="--kernels-dir nope: no such folder"):
        discovery.configure(["nope"])
    monkeypatch.setenv(discovery.ENV_KERNELS, str(tmp_path / "gone"))
    with pytest.raises(discovery.DiscoveryError, match="FA_HARNESS_KERNELS: kernels folder"):
        discovery.kernel_dirs()
    monkeypatch.delenv(discovery.ENV_KERNELS)
    (tmp_path / "pyproject.toml").write_text('[tool.fa-harness]\nkernels-dirs = ["x"]\n')
    with pytest.raises(discovery.DiscoveryError, match="does not exist"):
        discovery.kernel_dirs()
    (tmp_path / "pyproject.toml").write_text('[tool.fa-harness]\nkernels-dirs = "x"\n')
    with pytest.raises(discovery.DiscoveryError, match="must be a list of strings"):
        discovery.kernel_dirs()


def test_a_folder_of_sources_without_manifest_is_reported(tmp_path):
    (tmp_path / "k" / "broken").mkdir(parents=True)
    (tmp_path / "k" / "broken" / "x.cu").write_text("// no manifest\n")
    (tmp_path / "k" / "docs").mkdir()  # not a variant: no sources, no manifest
    discovery.configure([str(tmp_path / "k")])
    registry.discover(("cuda",))
    errors = [str(e) for e in registry.load_errors()]
    assert len(errors) == 1 and "broken" in errors[0] and "manifest.toml not found" in errors[0]


def test_children_see_the_parent_configuration(tmp_path):
    """What the command line configured reaches a child process (isolated candidates,
    the worker's scoring child) through the environment."""
    variant(tmp_path / "k", "inherited")
    discovery.configure([str(tmp_path / "k")], ["harness.candidates.flex:flex_candidates"])
    code = ("import json; from harness.candidates import discovery as d; c = d.current(); "
            "print(json.dumps([c.kernels_dirs, c.candidates]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == [[str(tmp_path / "k")],
                               ["harness.candidates.flex:flex_candidates"]]


@pytest.mark.parametrize("argv, needle", [
    (["kernels", "--kernels-dir", "no/such/dir"], "--kernels-dir no/such/dir: no such folder"),
    (["run", "--kernels-dir", "no/such/dir"], "--kernels-dir no/such/dir: no such folder"),
    (["ci", "--kernels-dir", "no/such/dir"], "--kernels-dir no/such/dir: no such folder"),
    (["submit", "x", "--kernels-dir", "no/such/dir"], "no such folder"),
    (["kernels", "--candidate", "no_such_module_x:c"], "no module named 'no_such_module_x'"),
    (["run", "--candidate", "harness.candidates.flex:missing"],
     "harness.candidates.flex has no attribute 'missing'"),
    (["kernels", "--candidate", "harness.candidates.flex"], "expected module:attribute"),
    (["run", "--candidate", "harness.candidates.flex:torch"], "is not a PythonKernel"),
])
def test_bad_discovery_input_is_one_line_exit_2(argv, needle, capsys):
    from harness.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_duplicate_through_the_cli_is_one_line_exit_2(tmp_path, capsys):
    from harness.cli import main

    variant(tmp_path / "a", "twice")
    variant(tmp_path / "b", "twice")
    assert main(["kernels", "--kernels-dir", str(tmp_path / "a"),
                 "--kernels-dir", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "'twice' is defined twice" in err and err.count("\n") == 1


def test_submit_by_discovered_name_and_python_names_refused(tmp_path, capsys):
    from harness.cli import main

    variant(tmp_path / "k", "named_one")
    discovery.configure([str(tmp_path / "k")])
    assert discovery.variant_path("named_one") == tmp_path / "k" / "named_one"
    assert discovery.variant_path("nothing_called_so") is None
    with pytest.raises(discovery.DiscoveryError, match="submissions are CUDA source"):
        discovery.variant_path("flex_attention")
    assert main(["submit", "flex_attention", "--db", str(tmp_path / "q.db")]) == 2
    assert "is a Python candidate" in capsys.readouterr().err


# ------------------------------------------------------------------ no silent set-up


@pytest.mark.parametrize("text, says", [
    ('[tool.fa-harness]\nkernel-dirs = ["k"]\n', "no key 'kernel-dirs' (did you mean kernels-dirs?)"),
    ('[tool.fa-harness]\nkernels_dirs = ["k"]\n', "no key 'kernels_dirs' (did you mean kernels-dirs?)"),
    ('[tool.fa_harness]\nkernels-dirs = ["k"]\n', "[tool.fa_harness] is not read; the table is [tool.fa-harness]"),
    ('[tool.fa-harnes]\nkernels-dirs = ["k"]\n', "[tool.fa-harnes] is not read"),
    ('[tool.FA-Harness]\nkernels-dirs = ["k"]\n', "[tool.FA-Harness] is not read"),
    ('[tool.fa-harness]\ntiming-min = "8"\n', "timing-min must be an integer"),
    ('[tool.fa-harness]\ntiming-cases = -1\n', "timing-cases must be an integer from 0 to 10000"),
])
def test_a_misspelt_setting_is_one_error_naming_the_known_keys(tmp_path, capsys, text, says):
    from harness.cli import main as cli_main

    variant(tmp_path / "k", "mine")
    (tmp_path / "pyproject.toml").write_text(text)
    with pytest.raises(discovery.DiscoveryError) as info:
        discovery.kernel_dirs()
    assert says in str(info.value) and "\n" not in str(info.value)
    assert "kernels-dirs, candidates, timing-min, timing-cases" in str(info.value) or \
        "must be" in str(info.value)
    # the commands a team runs first say it in one line and exit 2
    registry.clear_cache()
    assert cli_main(["kernels"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


def test_other_tools_tables_and_known_keys_are_fine(tmp_path):
    variant(tmp_path / "k", "mine")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.ruff]\nline-length = 100\n[tool.harness]\nx = 1\n'
        '[tool.fa-harness]\nkernels-dirs = ["k"]\ntiming-min = 4\ntiming-cases = 12\n')
    assert "mine" in origins()
    from harness.candidates.project import project_setting

    assert project_setting("timing-min", 8) == 4 and project_setting("timing-cases", 16) == 12


@pytest.mark.parametrize("content", [None, "README.md", "notes/"])
def test_an_empty_or_variantless_kernels_folder_is_an_error(tmp_path, content):
    k = tmp_path / "k"
    k.mkdir()
    if content == "README.md":
        (k / "README.md").write_text("our kernels will go here\n")
    elif content:
        (k / content).mkdir()
    discovery.configure([str(k)])
    with pytest.raises(discovery.DiscoveryError, match="holds no variant") as info:
        registry.discover(("cuda",))
    assert str(k) in str(info.value) and "--kernels-dir" in str(info.value)


def test_every_source_is_listed_with_what_it_gave(tmp_path):
    variant(tmp_path / "k", "mine")
    (tmp_path / "bad" / "broken").mkdir(parents=True)
    (tmp_path / "bad" / "broken" / "broken.cu").write_text("// no manifest\n")
    discovery.configure([str(tmp_path / "k"), str(tmp_path / "bad")])
    registry.discover(("cuda", "python"))
    lines = [s.line() for s in discovery.sources()]
    assert f"kernels folder {tmp_path / 'k'} (--kernels-dir): mine" in lines
    assert f"kernels folder {tmp_path / 'bad'} (--kernels-dir): nothing (1 failed to load)" \
        in lines
    assert any(line.startswith(f"kernels folder {KERNELS_ROOT} (shipped): ") and "fa2_mma" in line
               for line in lines)
    assert any(line.startswith("entry point flex_attention") for line in lines)


def test_ownership_the_teams_sources_are_owned_the_shipped_ones_are_yardsticks(tmp_path):
    variant(tmp_path / "k", "mine")
    discovery.configure([str(tmp_path / "k")])
    by_name = {c.name: c for c in registry.discover()}
    # run from the team's repository (here: a folder outside this source tree)
    assert not discovery.harness_is_the_project()
    assert registry.owned(by_name["mine"])
    for name in ("fa2_mma", "template", "flex_attention", "sdpa_flash", "fa2_model"):
        assert not registry.owned(by_name[name]), name
    # named on the command line (a glob too): owned
    assert registry.owned(by_name["fa2_mma"], ["fa2_*"])
    assert registry.owned(by_name["sdpa_flash"], ["sdpa_flash"])


def test_ownership_when_fa_harness_itself_is_the_project(monkeypatch):
    monkeypatch.chdir(KERNELS_ROOT.parents[1])  # this source tree's root
    assert discovery.harness_is_the_project()
    by_name = {c.name: c for c in registry.discover()}
    assert registry.owned(by_name["fa2_mma"]) and registry.owned(by_name["flex_attention"])
    assert not registry.owned(by_name["sdpa_flash"])  # the peers stay yardsticks
    # an installed copy is never "the project", wherever it is run from
    fake = Path("/venv/lib/python3.12/site-packages/harness/kernels")
    monkeypatch.setattr(discovery, "KERNELS_ROOT", fake)
    assert not discovery.harness_is_the_project(Path("/venv/lib/python3.12/site-packages"))


def test_a_later_command_with_other_folders_discovers_again(tmp_path, monkeypatch):
    """One process, several commands (the pytest plugin, a test suite running `ci` in
    process): each command's folders are searched, not the first one's candidates reused
    from the cache. Before, a `ci --kernels-dir DIR` after any discovery in the same
    process refused DIR's variants as unknown."""
    def names() -> set[str]:
        return {c.name for c in registry.discover()}

    assert "mine" not in names()
    variant(tmp_path / "k", "mine")
    discovery.configure([str(tmp_path / "k")])
    assert "mine" in names()
    discovery.configure([])
    assert "mine" not in names()
    monkeypatch.setenv(discovery.ENV_KERNELS, str(tmp_path / "k"))
    assert "mine" in names()
    monkeypatch.delenv(discovery.ENV_KERNELS)
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "pyproject.toml").write_text(
        '[tool.fa-harness]\nkernels-dirs = ["../k"]\n')
    monkeypatch.chdir(tmp_path / "team")
    assert "mine" in names()


def test_a_later_command_reports_only_its_own_load_errors(tmp_path):
    broken = tmp_path / "broken"
    (broken / "bad").mkdir(parents=True)
    (broken / "bad" / "manifest.toml").write_text("name = \"bad\"\n[supports\n")
    discovery.configure([str(broken)])
    registry.discover()
    assert registry.load_errors(), "the broken manifest was not reported"
    discovery.configure([])
    registry.discover()
    assert not registry.load_errors()


def test_a_source_tree_never_installed_says_why_its_python_candidates_are_missing(
        monkeypatch, capsys):
    """Imported from a checkout on PYTHONPATH without `pip install`, the harness has no
    entry points, so flex_attention and triton_fa2 vanish; `kernels` (and `run`, `ci`, the
    pytest plugin, which print the registry's notes) says why instead of listing fewer."""
    import importlib.metadata as md

    from harness.cli import main

    assert discovery.unregistered_note() is None   # this test environment installed it
    real = md.distribution

    def no_harness(name):
        if name == discovery.DIST_NAME:
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(md, "distribution", no_harness)
    monkeypatch.setattr(md, "entry_points", lambda **kw: [])
    registry.clear_cache()
    monkeypatch.setattr(registry, "_where_cached", None)
    assert main(["kernels"]) == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert "flex_attention" not in out
    assert "fa-harness is not installed" in " ".join(out.split())
    assert "pip install -e ." in out
    registry.clear_cache()
