"""Never green unmeasured: an owned candidate that cannot run here, or gets fewer timed
cases than its floor, makes `fa-harness ci` exit 3 ("not measured"), said on the summary's
first line; `--require-gpu` fails at once without a working GPU; `--kernels` takes globs;
failures of yardsticks are reported, not the team's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.candidates import discovery, registry
from harness.candidates.variants import KERNELS_ROOT
from harness.cli import main as cli_main
from harness.core.cases import Case, MaskKind
from harness.core.results import CaseResult, Status, Timing
from harness.records.synthetic import make_record, specs_for
from harness.runs import gate, gate_run
from harness.runs.gate import GateOptions, finish
from harness.runs.plan import Plan

TINY = [Case(1, 2, 2, 17, 33, 16, "float16", MaskKind.CAUSAL_BR),
        Case(2, 2, 1, 9, 9, 32, "bfloat16", MaskKind.KEY_PADDING)]


@pytest.fixture
def team_repo(tmp_path, monkeypatch):
    """A team's repository: its own variant in kernels/, named in pyproject.toml; run from
    there (so the shipped candidates are yardsticks), on a machine without a GPU."""
    from harness.core import grids

    repo = tmp_path / "repo"
    dst = repo / "kernels" / "mine"
    shutil.copytree(KERNELS_ROOT / "template", dst)
    man = dst / "manifest.toml"
    man.write_text(man.read_text().replace('name = "template"', 'name = "mine"'))
    (repo / "pyproject.toml").write_text('[tool.fa-harness]\nkernels-dirs = ["kernels"]\n')
    monkeypatch.chdir(repo)
    monkeypatch.delenv(discovery.ENV_KERNELS, raising=False)
    monkeypatch.delenv(discovery.ENV_CONFIG, raising=False)
    monkeypatch.setattr(discovery, "_config", discovery.Config())
    monkeypatch.setenv("FA_HARNESS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setitem(grids.GRIDS, "tiny", lambda: list(TINY))
    monkeypatch.setattr(gate_run, "gpu_state", lambda: (False, "no GPU in this test"))
    registry.clear_cache()
    yield repo
    registry.clear_cache()


def test_a_gpu_less_runner_is_not_measured_and_says_which_candidate(team_repo, capsys):
    args = ["ci", "--grid", "tiny", "--db", str(team_repo / "ci.sqlite"),
            "--summary", str(team_repo / "s.md")]
    assert cli_main(args) == 3
    out = capsys.readouterr().out
    first = (team_repo / "s.md").read_text().splitlines()[0]
    assert first.startswith("## fa-harness CI: NOT MEASURED (not measured: mine (no GPU here)")
    # the team's variant only: the shipped ones are yardsticks in a team's repository
    assert "fa2_mma (no GPU" not in first
    assert f"from kernels folder {team_repo / 'kernels'} (pyproject.toml" in out


def test_require_gpu_fails_at_once_on_a_gpu_less_runner(team_repo, capsys):
    db = team_repo / "ci.sqlite"
    assert cli_main(["ci", "--require-gpu", "--db", str(db)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fa-harness ci: not measured: --require-gpu: no working CUDA GPU here "
                   "(no GPU in this test)"]
    assert not db.exists()


def test_kernels_takes_globs_and_only_what_it_names_is_required(team_repo, capsys):
    args = ["ci", "--grid", "tiny", "--kernels", "*_model", "--db",
            str(team_repo / "ci.sqlite")]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "ok   fa2_model: passed 2" in out and "ok   naive_model: passed 2" in out
    assert cli_main(["ci", "--grid", "tiny", "--kernels", "my_*"]) == 2
    assert "unknown kernel(s) my_*" in capsys.readouterr().err


def _timed(name: str, n: int) -> list[CaseResult]:
    out = []
    for i in range(n):
        r = CaseResult(name, Case(1, 2, 2, 64 + i, 64, 64, "float16", MaskKind.NONE),
                       Status.PASSED)
        r.timing = Timing(median_ms=1.0, samples_ms=[1.0] * 20)
        out.append(r)
    return out


def test_an_owned_candidate_under_its_floor_is_not_measured():
    plan = Plan(budget_s=300, min_time_s=0.2, minimum={"mine": 8, "other": 2, "none": 0})
    timed = _timed("mine", 5) + _timed("other", 2)
    timed[0].timing = Timing(median_ms=None, samples_ms=[])  # a case with no valid sample
    assert gate_run.timed_count(timed, "mine") == 4
    assert gate_run._under_floor(plan, timed, []) == [
        ("mine", "4 timed case(s), fewer than its floor of 8")]
    # already not measured for another reason: said once
    assert gate_run._under_floor(plan, timed, [("mine", "no GPU here")]) == []


def test_exit_codes_failure_beats_not_measured_beats_green(tmp_path):
    def opts() -> GateOptions:
        return GateOptions(db_url=str(tmp_path / "db.sqlite"), spool_dir=tmp_path / "spool",
                           summary=tmp_path / "s.md")

    quiet = lambda _line: None  # noqa: E731
    ok = finish(make_record(specs_for(), seed=1), opts(), log=quiet)
    assert ok.exit_code == 0
    nm = finish(make_record(specs_for(), seed=2, minutes=1), opts(), log=quiet,
                not_measured=[("fa2", "3 timed case(s), fewer than its floor of 8")])
    assert nm.exit_code == gate.EXIT_NOT_MEASURED == 3
    assert nm.summary.startswith("## fa-harness CI: NOT MEASURED (not measured: fa2 (3 timed")
    specs = specs_for()
    specs[0].status = "failed"
    bad = finish(make_record(specs, seed=3, minutes=2), opts(), log=quiet,
                 not_measured=[("fa2", "no GPU here")])
    assert bad.exit_code == 1 and bad.summary.startswith("## fa-harness CI: FAILED")


def test_a_yardstick_failure_is_reported_not_the_teams(tmp_path):
    specs = specs_for(kernels=("fa2", "shipped_one"))
    for s in specs[3:]:
        s.status = "failed"
    rec = make_record(specs, seed=1)
    rec.kernels["shipped_one"]["owned"] = False
    out = finish(rec, GateOptions(db_url=str(tmp_path / "db.sqlite"),
                                  spool_dir=tmp_path / "spool"), log=lambda _l: None)
    assert out.exit_code == 0 and out.failures == []
    assert any(p.startswith("peer divergence: shipped_one") for p in out.peer_divergences)


def test_a_sanitizer_finding_fails_the_gate_with_its_line(tmp_path):
    from harness.execution.sanitize import SanitizeOutcome

    line = ("sanitize far_writer: memcheck: 4 errors: Invalid __global__ write of size 2 "
            "bytes in rowwarp+0x33c0 at far_writer.cu:97 (3,145,728 bytes after an "
            "allocation of 32 bytes)")
    out = finish(make_record(specs_for(), seed=1),
                 GateOptions(db_url=str(tmp_path / "db.sqlite"), spool_dir=tmp_path / "sp"),
                 log=lambda _l: None,
                 sanitizer=[SanitizeOutcome("far_writer", line, True),
                            SanitizeOutcome("fa2_mma", "sanitize fa2_mma: clean", False)])
    assert out.exit_code == 1
    assert out.summary.startswith("## fa-harness CI: FAILED (1 sanitizer finding(s))")
    assert f"- FAILED {line}" in out.summary and "- sanitize fa2_mma: clean" in out.summary


def test_the_sanitizer_tier_defaults_and_refusals(monkeypatch):
    from harness.execution import sanitize
    from harness.runs.gate_options import GateUsageError
    from harness.runs.gate_prepare import sanitize_tier

    notes: list[str] = []
    monkeypatch.setattr(sanitize, "sanitizer_path", lambda: "/usr/bin/compute-sanitizer")
    assert sanitize_tier(GateOptions(), True, notes) == "fast"
    assert sanitize_tier(GateOptions(sanitize="full"), True, notes) == "full"
    assert sanitize_tier(GateOptions(sanitize="none"), True, notes) is None
    assert sanitize_tier(GateOptions(), False, notes) is None and notes == []
    monkeypatch.setattr(sanitize, "sanitizer_path", lambda: None)
    assert sanitize_tier(GateOptions(), True, notes) is None
    assert notes == ["sanitizer tier not run: compute-sanitizer not found"]
    with pytest.raises(GateUsageError, match="--sanitize fast: compute-sanitizer not found"):
        sanitize_tier(GateOptions(sanitize="fast"), True, notes)


def test_timing_settings_come_from_the_project_then_the_options(team_repo):
    from harness.runs.gate_options import default_timing

    assert default_timing(GateOptions()) == (8, 16)
    (team_repo / "pyproject.toml").write_text(
        '[tool.fa-harness]\nkernels-dirs = ["kernels"]\ntiming-min = 4\ntiming-cases = 6\n')
    assert default_timing(GateOptions()) == (4, 6)
    assert default_timing(GateOptions(timing_min=10)) == (10, 10)
    assert Path(team_repo / "pyproject.toml").exists()


def test_a_yardstick_slower_than_its_baseline_is_reported_not_failed(tmp_path):
    """On the H200 the slowed-fa2_mma run also flagged sdpa_cudnn +2.4% on a 10 us decode
    case: a peer's time is not the team's commit."""
    opts = GateOptions(db_url=str(tmp_path / "db.sqlite"), spool_dir=tmp_path / "spool")
    quiet = lambda _line: None  # noqa: E731
    first = finish(make_record(specs_for(kernels=("mine", "peer")), seed=1,
                               commit="a" * 40), opts, log=quiet)
    assert first.exit_code == 0
    slow = specs_for(kernels=("mine", "peer"))
    slow[3].median_ms *= 1.10  # the peer's first case
    rec = make_record(slow, seed=2, commit="b" * 40, parent="a" * 40, minutes=1)
    rec.kernels["peer"]["kind"] = "peer"
    out = finish(rec, opts, log=quiet)
    assert out.exit_code == 0 and out.regressions == []
    assert [v.variant for v in out.yardstick_changes] == ["peer"]
    assert "- yardstick peer: 1 regression verdict(s) against the baseline (reported, " \
        "not a failure)" in out.summary
    # the team's own, the same: red
    slow = specs_for(kernels=("mine", "peer"))
    slow[0].median_ms *= 1.10
    out = finish(make_record(slow, seed=3, commit="c" * 40, parent="b" * 40, minutes=2),
                 opts, log=quiet)
    assert out.exit_code == 1 and [v.variant for v in out.regressions] == ["mine"]


def test_the_warm_up_replays_what_the_later_processes_will_run():
    """The warm-up must compile what the correctness children and the timing child will
    load: a CUDA variant's module, and each Python candidate's calls in the order each of
    those processes makes them (the timing child: the plan's cases for it; the correctness
    children: one per mask kind, unsupported cases dropped as the runner drops them)."""
    from dataclasses import dataclass, field

    from harness.core.grids import get_grid
    from harness.runs.gate_prepare import warm_tasks
    from harness.runs.plan import make_plan

    @dataclass
    class Fake:
        name: str
        kind: str
        device: str = "cuda"
        isolate: bool = True
        meta: dict = field(default_factory=dict)

        def supports(self, case):
            return "no d=128" if self.kind == "python" and case.head_dim == 128 else None

    cands = [Fake("cu", "cuda"), Fake("py", "python"), Fake("cpu_model", "model", "cpu")]
    smoke, timing = get_grid("smoke"), get_grid("perf")
    plan = make_plan(cands, smoke, timing, owned=["cu", "py"])
    tasks = warm_tasks(cands, plan, smoke)
    by = {(t.name, t.what): t.cases for t in tasks}
    assert by[("cu", "compile")] == smoke[:1]
    assert by[("py", "timing")] == plan.wanted["py"] and len(plan.wanted["py"]) == 16
    assert all(c.head_dim != 128 for c in by[("py", "timing")])
    masks = {w for n, w in by if n == "py" and w.startswith("correctness")}
    assert masks == {f"correctness {m}" for m in {str(c.mask) for c in smoke}}
    replayed = [c for (n, w), cs in by.items() if n == "py" and w != "timing" for c in cs]
    assert sorted(c.id for c in replayed) == sorted(c.id for c in smoke if c.head_dim != 128)
    assert not any(t.name == "cpu_model" for t in tasks)
    # the gate's own warm-up (correctness compiles itself, side by side): timing only
    assert [(t.name, t.what) for t in warm_tasks(cands, plan, correctness=False)] == \
        [("py", "timing")]
