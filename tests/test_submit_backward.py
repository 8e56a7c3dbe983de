"""A submission with a `[backward]`: validated like the forward (launch and workspace
limits at every case it is scored on, the nvcc compile of its entries) and queued, or
rejected with one message naming the backward's launch."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from sqlalchemy import select

from harness.cli import main
from harness.records.db import open_db
from harness.records.db.models import Submission
from harness.submissions import submit

ROOT = Path(__file__).resolve().parent.parent
FA2_MMA = ROOT / "harness" / "kernels" / "fa2_mma"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


@pytest.fixture(autouse=True)
def _sandbox_backend(monkeypatch):
    """As in test_submit.py: without bubblewrap, compiles run under resource limits."""
    if shutil.which("bwrap") is None:
        monkeypatch.setenv("FA_HARNESS_SANDBOX", "rlimits")


def _fa2_mma(tmp_path: Path, edit=None) -> Path:
    """A copy of the shipped fa2_mma variant (forward and backward), its manifest's
    backward part optionally rewritten by `edit`."""
    folder = tmp_path / "fa2_mma"
    shutil.copytree(FA2_MMA, folder)
    if edit is not None:
        manifest = folder / "manifest.toml"
        text = manifest.read_text()
        at = text.index("[backward]")
        manifest.write_text(text[:at] + edit(text[at:]))
    return folder


def _reject(folder: Path) -> str:
    with pytest.raises(submit.Rejected) as e:
        submit.validate(submit.pack_path(folder), compile_sources=False)
    return str(e.value)


def test_a_backward_is_validated_at_the_cases_it_is_scored_on(tmp_path):
    v = submit.validate(submit.pack_path(_fa2_mma(tmp_path)), compile_sources=False)
    bwd = v.limits["backward"]
    assert bwd["cases_checked"] > 0 and bwd["threads"] == 128
    # its own launches and workspaces: the dQ accumulator at the largest perf-bwd case
    from harness.core.grids import get_grid

    biggest = max(c.batch * c.heads * c.seqlen_q * c.head_dim for c in get_grid("perf-bwd"))
    assert bwd["workspace_bytes"] >= biggest * 4
    assert v.limits["shared_bytes"] > 48 * 1024  # the forward's, as before


def test_a_backward_launch_over_the_limits_is_one_clear_rejection(tmp_path):
    folder = _fa2_mma(tmp_path, lambda t: t.replace(
        'grid = ["ceil_div(seqlen_k, 64)", "kv_heads", "batch"]\nblock = [128, 1, 1]',
        'grid = ["ceil_div(seqlen_k, 64)", "kv_heads", "batch"]\nblock = [2048, 1, 1]'))
    msg = _reject(folder)
    assert msg.startswith("backward.launch[1] (fa2_mma_bwd_main_{dtype}_d{head_dim}): "
                          "block [2048, 1, 1] = 2048 threads at case "), msg
    assert msg.endswith("exceeds 1024 threads per block") and "\n" not in msg


def test_a_backward_grid_too_large_only_at_perf_bwd_cases_is_caught(tmp_path):
    """Fine on the correctness grid, too many blocks on the longest perf-bwd cases: the
    backward is checked at the cases it is timed on, not only at those it is checked on."""
    folder = _fa2_mma(tmp_path, lambda t: t.replace(
        'grid = ["ceil_div(batch * heads * seqlen_q, 4)", 1, 1]\nblock = [128, 1, 1]\n\n'
        '[[backward.launch]]\nentry = "fa2_mma_bwd_main',
        'grid = ["ceil_div(batch * heads * seqlen_q, 4) * ceil_div(seqlen_k, 64)", 1, 1]'
        '\nblock = [128, 1, 1]\n\n[[backward.launch]]\nentry = "fa2_mma_bwd_main', 1))
    msg = _reject(folder)
    assert msg.startswith("backward.launch[0] (fa2_mma_bwd_pre_{dtype}_d{head_dim}): ")
    assert "exceed the limit of 16777216 blocks per launch" in msg
    case = re.search(r"at case (\S+)", msg).group(1)
    from harness.core.grids import get_grid

    assert case in {c.id for c in get_grid("perf-bwd")}
    assert case not in {c.id for c in get_grid("full")}


def test_a_backward_workspace_over_the_limit_is_rejected(tmp_path):
    folder = _fa2_mma(tmp_path, lambda t: t.replace(
        'elements = "batch * heads * seqlen_q * head_dim"',
        'elements = "batch * heads * seqlen_q * seqlen_k * head_dim"'))
    msg = _reject(folder)
    assert msg.startswith("backward.workspace[1] (dq_accum): ") and "exceed the limit" in msg


@pytest.fixture
def db(tmp_path):
    d = open_db(str(tmp_path / "s.sqlite"))
    yield d
    d.close()


def test_the_cli_records_a_bad_backward_as_rejected(db, tmp_path, capsys):
    folder = _fa2_mma(tmp_path, lambda t: t.replace('block = [128, 1, 1]',
                                                    'block = [0, 1, 1]', 1))
    assert main(["submit", str(folder), "--db", db.url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rejected" in err[0] and "backward.launch[0]" in err[0]
    assert str(tmp_path) not in err[0]  # nothing of the host's paths
    with db.sessions() as s:
        row = s.scalars(select(Submission)).one()
        assert (row.status, row.verdict) == ("done", "rejected")


@needs_nvcc
@pytest.mark.nvcc
def test_a_variant_with_its_backward_compiles_and_is_queued(db, tmp_path, capsys):
    folder = _fa2_mma(tmp_path)
    assert main(["submit", str(folder), "--db", db.url]) == 0, capsys.readouterr()
    with db.sessions() as s:
        row = s.scalars(select(Submission)).one()
        assert (row.status, row.verdict) == ("queued", None)
        assert row.manifest["backward"]["deterministic"] is False
        assert row.detail["limits"]["backward"]["cases_checked"] > 0
