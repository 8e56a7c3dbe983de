"""bench/ab_prepare.py writes a variant as it was at a revision, renamed, loadable beside the
working tree's; bad input exits 2 with one line and writes nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from benchscripts import load

from harness.candidates.variants import load_variant_dir

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the git history")


def _main():
    return load("ab_prepare").main


def _git_show(path: str) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{path}"], check=True,
                          capture_output=True).stdout


def test_the_copy_is_the_revision_renamed_with_its_flavors(tmp_path, capsys):
    main = _main()
    assert main(["HEAD", "--variant", "harness/kernels/fa2_mma", "--as", "fa2_old",
                 "--out", str(tmp_path)]) == 0
    copy = tmp_path / "fa2_old"
    spec = load_variant_dir(copy)
    assert spec.name == "fa2_old"
    assert [f.name for f in spec.flavors] == ["fa2_old_det"]
    shipped = load_variant_dir(ROOT / "harness" / "kernels" / "fa2_mma")
    # Only the names differ: the same entries, launches and sources, byte for byte.
    assert spec.entry_names() == shipped.entry_names()
    assert spec.launches == shipped.launches and spec.workspaces == shipped.workspaces
    for src in spec.sources:
        assert (copy / src).read_bytes() == _git_show(f"harness/kernels/fa2_mma/{src}")
    assert "fa2_old" in capsys.readouterr().out
    # Again under the same name: replaced, not nested or duplicated.
    (copy / "stale.txt").write_text("x")
    assert main(["HEAD", "--variant", "harness/kernels/fa2_mma/", "--as", "fa2_old",
                 "--out", str(tmp_path)]) == 0
    assert not (copy / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fa2_old"]


@pytest.mark.parametrize(("argv", "message"), [
    (["no-such-revision", "--variant", "harness/kernels/fa2_mma", "--as", "x"],
     "git knows no revision 'no-such-revision'"),
    (["HEAD", "--variant", "harness/kernels", "--as", "x"], "holds no manifest.toml"),
    (["HEAD", "--variant", "harness/kernels/fa2_mma", "--as", "fa2_mma"],
     "must differ from the variant's own name"),
    (["HEAD", "--variant", "harness/kernels/fa2_mma", "--as", "fa2-old"],
     "is not an identifier"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "ab"
    assert _main()([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()
