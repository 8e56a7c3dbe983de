"""A team declares a candidate a yardstick (`[tool.fa-harness] yardsticks`, `fa-harness ci
--yardsticks`): a third-party kernel it brings for comparison is timed and compared for
reference, recorded as not the team's, reported, and never fails the gate.

The gate runs on the CPU: two Python candidates of the team's pyproject.toml, the timing
grid only (so nothing runs on this machine), and the timed results of a GPU run put in
their place (harness.records.synthetic), the yardstick 30% slower on the second commit."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from harness.candidates import discovery, registry
from harness.cli import main as cli_main
from harness.core.results import CaseResult, Timing
from harness.records.db.store import open_db
from harness.records.record import RunRecord
from harness.records.synthetic import DEFAULT_CASES, H200, Spec, entry
from harness.runs import gate, gate_run

MODULE = '''
import torch

from harness.candidates.python_candidate import PythonKernel


def _sdpa(q, k, v, *, mask_kind, mask, key_lengths, causal_offset, scale):
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                            scale=scale).to(q.dtype)


ours = PythonKernel(name="ours", fn=_sdpa, device="cpu", masks=("none",))
flashinfer = PythonKernel(name="flashinfer_ref", fn=_sdpa, device="cpu", masks=("none",))
'''
CANDIDATES = 'candidates = ["team_attn:ours", "team_attn:flashinfer"]\n'


def _timed(spec: Spec, rng: random.Random) -> CaseResult:
    """A timed result of `spec` as a GPU run makes one (samples drawn with `rng`)."""
    e = entry(spec, rng)
    res = CaseResult.from_dict(e)
    res.timing = Timing(samples_ms=e["samples_ms"], median_ms=e["median_ms"],
                        min_ms=e["min_ms"], iqr_ms=e["iqr_ms"], rel_noise=e["rel_noise"],
                        method="synthetic")
    return res


@pytest.fixture
def team(tmp_path, monkeypatch):
    """A team's repository with its two Python candidates, run from there, no GPU; each
    gate run gets the timings of `team.slow` (name -> factor) on a GPU."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "team_attn.py").write_text(MODULE)
    monkeypatch.chdir(repo)
    monkeypatch.syspath_prepend(str(repo))
    monkeypatch.delenv(discovery.ENV_KERNELS, raising=False)
    monkeypatch.delenv(discovery.ENV_CONFIG, raising=False)
    monkeypatch.setattr(discovery, "_config", discovery.Config())
    monkeypatch.setenv("FA_HARNESS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FA_HARNESS_BRANCH", "main")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setattr(gate_run, "gpu_state", lambda: (False, "no GPU in this test"))
    slow: dict[str, float] = {}
    real = gate.execute

    def timed(opts: gate.GateOptions, *, log: Any = print) -> gate.Execution:
        ex = real(opts, log=log)
        rng = random.Random(len(slow) + sum(slow.values()))
        ex.results += [_timed(Spec(k, c, median_ms=(1.0 + 0.1 * i) * slow.get(k, 1.0)), rng)
                       for k in ("ours", "flashinfer_ref")
                       for i, c in enumerate(DEFAULT_CASES, start=1)]
        ex.meta["gpu"] = dict(H200)
        return ex

    monkeypatch.setattr(gate, "execute", timed)
    registry.clear_cache()
    yield repo, slow
    registry.clear_cache()


def _ci(repo: Path, commit: str, parent: str | None, monkeypatch, *extra: str) -> int:
    monkeypatch.setenv("FA_HARNESS_COMMIT", commit * 40)
    if parent:
        monkeypatch.setenv("FA_HARNESS_PARENT", parent * 40)
    registry.clear_cache()
    return cli_main(["ci", "--grid", "perf", "--db", str(repo / "ci.sqlite"),
                     "--summary", str(repo / "s.md"), "--record", str(repo / "run.json"),
                     *extra])


def _two_commits(repo: Path, slow: dict[str, float], monkeypatch, *extra: str) -> int:
    assert _ci(repo, "a", None, monkeypatch, *extra) == 0
    slow["flashinfer_ref"] = 1.3
    return _ci(repo, "b", "a", monkeypatch, *extra)


def test_a_declared_yardstick_30_percent_slower_is_reported_not_failed(team, monkeypatch,
                                                                        capsys):
    repo, slow = team
    (repo / "pyproject.toml").write_text(
        f'[tool.fa-harness]\n{CANDIDATES}yardsticks = ["flashinfer*"]\n')
    assert _two_commits(repo, slow, monkeypatch) == 0
    rec = RunRecord.read(repo / "run.json")
    assert rec.kernels["flashinfer_ref"]["owned"] is False
    assert rec.kernels["ours"]["owned"] is True
    assert rec.env["ci_plan"]["owned"] == ["ours"]
    summary = (repo / "s.md").read_text()
    assert summary.startswith("## fa-harness CI: passed"), summary.splitlines()[0]
    assert "- yardstick flashinfer_ref: 3 regression verdict(s) against the baseline " \
        "(reported, not a failure)" in summary
    # Its alerts are a yardstick's: none of the team's is open.
    from harness.records.alerts import list_alerts

    with open_db(str(repo / "ci.sqlite")) as db:
        alerts = list_alerts(db, state="open")
    assert alerts and all(a.variant == "flashinfer_ref" and not a.owned for a in alerts)
    capsys.readouterr()


def test_the_same_slowdown_undeclared_fails_the_gate(team, monkeypatch, capsys):
    repo, slow = team
    (repo / "pyproject.toml").write_text(f'[tool.fa-harness]\n{CANDIDATES}')
    assert _two_commits(repo, slow, monkeypatch) == 1
    rec = RunRecord.read(repo / "run.json")
    assert rec.kernels["flashinfer_ref"]["owned"] is True
    assert "fa-harness CI: FAILED" in (repo / "s.md").read_text()
    capsys.readouterr()


def test_the_command_line_declares_a_yardstick_and_beats_the_project(team, monkeypatch,
                                                                     capsys):
    repo, slow = team
    # The project declares nothing of these two: the command line's word holds.
    (repo / "pyproject.toml").write_text(f'[tool.fa-harness]\n{CANDIDATES}'
                                         'yardsticks = ["ours"]\n')
    assert _two_commits(repo, slow, monkeypatch, "--yardsticks", "flashinfer_ref") == 0
    rec = RunRecord.read(repo / "run.json")
    assert rec.kernels["flashinfer_ref"]["owned"] is False
    assert rec.kernels["ours"]["owned"] is True
    assert "- yardstick flashinfer_ref: 3 regression verdict(s)" in \
        (repo / "s.md").read_text()
    capsys.readouterr()


def test_bad_values_are_refused_with_one_line(team, monkeypatch, capsys):
    repo, _slow = team
    (repo / "pyproject.toml").write_text(f'[tool.fa-harness]\n{CANDIDATES}'
                                         'yardsticks = "flashinfer*"\n')
    assert _ci(repo, "a", None, monkeypatch) == 2
    err = capsys.readouterr().err
    assert "[tool.fa-harness] yardsticks must be a list of strings" in err
    assert len(err.strip().splitlines()) == 1
    (repo / "pyproject.toml").write_text(f'[tool.fa-harness]\n{CANDIDATES}yardsticks = [""]\n')
    assert _ci(repo, "a", None, monkeypatch) == 2
    assert "yardsticks must be a list of candidate names or globs" in capsys.readouterr().err
    (repo / "pyproject.toml").write_text(f'[tool.fa-harness]\n{CANDIDATES}')
    assert _ci(repo, "a", None, monkeypatch, "--yardsticks", " , ") == 2
    assert "--yardsticks needs at least one" in capsys.readouterr().err
    assert _ci(repo, "a", None, monkeypatch, "--yardsticks", "flashinfr*") == 2
    assert "--yardsticks: unknown candidate(s) flashinfr*" in capsys.readouterr().err
    assert not (repo / "ci.sqlite").exists()


def test_declaring_every_team_candidate_a_yardstick_leaves_nothing_to_judge(team,
                                                                            monkeypatch,
                                                                            capsys):
    repo, _slow = team
    (repo / "pyproject.toml").write_text(f'[tool.fa-harness]\n{CANDIDATES}'
                                         'yardsticks = ["ours", "flashinfer_ref"]\n')
    assert _ci(repo, "a", None, monkeypatch) == gate.EXIT_NOT_MEASURED
    assert "nothing of the team's was found to judge" in capsys.readouterr().err
    # --kernels naming only a yardstick times nothing of the team's either.
    (repo / "pyproject.toml").write_text(f'[tool.fa-harness]\n{CANDIDATES}')
    assert _ci(repo, "a", None, monkeypatch, "--kernels", "flashinfer_ref",
               "--yardsticks", "flashinfer_ref") == gate.EXIT_NOT_MEASURED
    capsys.readouterr()
    assert registry.owned(registry.get_candidate("ours"))
    assert not registry.owned(registry.get_candidate("ours"), ("ours",), ("ours",))
