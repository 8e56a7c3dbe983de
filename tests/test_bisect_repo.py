"""`fa-harness bisect` over a team's git repository on the CPU: the worktrees, the
backfill runs, the alert's culprit and the one-line errors. Timing needs a GPU, so the
child that times a commit is replaced by one that reads the commit's `speed.txt` from its
worktree (proof that the commit really is checked out there)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from harness.candidates.discovery import KERNELS_ROOT
from harness.cli import main as cli_main
from harness.runs.bisect_measure import BACKFILL_GRID, WorktreeMeasure
from harness.runs.bisect_run import BisectRequest, BisectUsageError, prepare, run_bisect

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

KERNEL = "team_fa"
GPU = {"name": "NVIDIA H100 80GB HBM3"}
SPEEDS = [1.0, 1.0, 1.0, 1.0, 1.05, 1.05, 1.05]  # commit 4 is 5% slower


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def team_repo(tmp_path: Path) -> tuple[Path, list[str]]:
    """A team's repository: pyproject naming its kernels folder, one variant (the shipped
    template renamed), one commit per entry of SPEEDS, each writing its speed."""
    repo = tmp_path / "team"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "ci@example.com")
    git(repo, "config", "user.name", "ci")
    (repo / "pyproject.toml").write_text('[tool.fa-harness]\nkernels-dirs = ["kernels"]\n')
    dst = repo / "kernels" / KERNEL
    shutil.copytree(KERNELS_ROOT / "template", dst)
    man = dst / "manifest.toml"
    man.write_text(man.read_text().replace('name = "template"', f'name = "{KERNEL}"'))
    (repo / ".gitignore").write_text("build/\n")
    commits = []
    for i, speed in enumerate(SPEEDS):
        (repo / "speed.txt").write_text(f"{speed}\n")
        (dst / "notes.txt").write_text(f"change {i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"change {i}")
        commits.append(git(repo, "rev-parse", "HEAD"))
    return repo, commits


def case_ids(n: int = 6) -> list[str]:
    from harness.core.grids import get_grid

    return [c.id for c in get_grid("smoke")[:n]]


def fake_child(calls: list[tuple[str, Path]], *, interrupt_at: int | None = None):
    """WorktreeMeasure._run_child without a GPU: each case's median is its base time
    times the speed the checked-out commit wrote."""
    from harness.core.cases import Case
    from harness.core.results import CaseResult, Status, Timing
    from harness.records.record import RunRecord

    def run_child(self: WorktreeMeasure, tree: Path, commit: str) -> RunRecord:
        calls.append((commit, tree))
        if interrupt_at is not None and len(calls) == interrupt_at:
            raise KeyboardInterrupt
        assert git(tree, "rev-parse", "HEAD") == commit
        speed = float((tree / "speed.txt").read_text())
        results = [CaseResult(self.kernel, Case.from_id(cid), Status.PASSED,
                              timing=Timing(samples_ms=[0.1 * (k + 1) * speed] * 3,
                                            median_ms=0.1 * (k + 1) * speed))
                   for k, cid in enumerate(self.cases)]
        return RunRecord.from_results(results, {
            "source": "ci", "grids": [BACKFILL_GRID], "commit": commit, "parent": None,
            "branch": None, "env": {}, "gpu": dict(GPU),
            "kernels": {self.kernel: {"kind": "cuda"}}})
    return run_child


@pytest.fixture
def no_gpu_needed(monkeypatch):
    calls: list[tuple[str, Path]] = []
    monkeypatch.setattr(WorktreeMeasure, "ready", lambda self: None)
    monkeypatch.setattr(WorktreeMeasure, "_run_child", fake_child(calls))
    return calls


def bisect_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("fa-harness-bisect-*")}


def test_bisect_names_the_commit_that_slowed_the_kernel_and_leaves_no_worktree(
        team_repo, no_gpu_needed, tmp_path):
    repo, commits = team_repo
    before = bisect_dirs()
    req = BisectRequest(repo=repo, good=commits[0], bad=commits[-1], kernel=KERNEL,
                        cases=",".join(case_ids()), db_url=str(tmp_path / "r.sqlite"))
    out = run_bisect(req, log=lambda _line: None)
    assert out.result.exact and out.result.culprit == commits[4]
    assert f"first bad commit: {commits[4]}" in "\n".join(out.lines())
    trees = {tree for _c, tree in no_gpu_needed}
    assert all(not t.exists() for t in trees)
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert bisect_dirs() == before
    # one worktree per commit: each commit's runs (the ends' three) share it
    assert len(trees) == out.result.builds == len({c for c, _t in no_gpu_needed})


def test_ctrl_c_removes_the_worktree(team_repo, monkeypatch, tmp_path):
    repo, commits = team_repo
    calls: list[tuple[str, Path]] = []
    monkeypatch.setattr(WorktreeMeasure, "ready", lambda self: None)
    monkeypatch.setattr(WorktreeMeasure, "_run_child", fake_child(calls, interrupt_at=5))
    req = BisectRequest(repo=repo, good=commits[0], bad=commits[-1], kernel=KERNEL,
                        cases=",".join(case_ids()), db_url=str(tmp_path / "r.sqlite"))
    with pytest.raises(KeyboardInterrupt):
        run_bisect(req, log=lambda _line: None)
    assert calls and not calls[-1][1].exists()
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_max_builds_bounds_the_worktrees_made(team_repo, no_gpu_needed, tmp_path):
    repo, commits = team_repo
    req = BisectRequest(repo=repo, good=commits[0], bad=commits[-1], kernel=KERNEL,
                        cases=",".join(case_ids()), db_url=str(tmp_path / "r.sqlite"),
                        max_builds=3)
    out = run_bisect(req, log=lambda _line: None)
    assert not out.result.exact and "--max-builds 3" in out.result.reason
    assert len({c for c, _t in no_gpu_needed}) == 3


def _stored_run(db, commit: str, parent: str | None, when: datetime, speed: float,
                grids: list[str]) -> int:
    from harness.core.cases import Case
    from harness.core.results import CaseResult, Status, Timing
    from harness.records.db.store import store_record
    from harness.records.record import RunRecord

    results = [CaseResult(KERNEL, Case.from_id(cid), Status.PASSED,
                          timing=Timing(samples_ms=[0.1 * (k + 1) * speed] * 3,
                                        median_ms=0.1 * (k + 1) * speed))
               for k, cid in enumerate(case_ids())]
    rec = RunRecord.from_results(results, {
        "source": "ci", "grids": grids, "commit": commit, "parent": parent,
        "branch": "main", "env": {}, "gpu": dict(GPU), "created_at": when.isoformat(),
        "kernels": {KERNEL: {"kind": "cuda", "owned": True}}})
    return store_record(db, rec)


def test_alert_culprit_and_backfill_runs_in_commit_order_never_a_baseline(
        team_repo, no_gpu_needed, tmp_path):
    from harness.records.alerts import get_alert
    from harness.records.db.models import AlertRow, Run
    from harness.records.db.store import baseline_runs, get_run, open_db
    from harness.records.step_gate import history_from_db

    repo, commits = team_repo
    url = str(tmp_path / "r.sqlite")
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    with open_db(url) as db:
        _stored_run(db, commits[0], None, t0, 1.0, ["smoke", "perf"])
        bad_id = _stored_run(db, commits[-1], commits[-2], t0 + timedelta(hours=6), 1.05,
                             ["smoke", "perf"])
        with db.session() as s:
            row = AlertRow(gpu_model_key=get_run(db, bad_id).gpu_model_key, variant=KERNEL,
                           pass_name="fwd", kind="timing", verdict="regression", owned=True,
                           state="open", first_bad_commit=commits[-1],
                           last_good_commit=commits[0], first_run_id=bad_id,
                           last_run_id=bad_id, cases=case_ids(), worst_ratio=1.05,
                           worst_case=case_ids()[0])
            s.add(row)
            s.flush()
            alert_id = row.id
    out = run_bisect(BisectRequest(repo=repo, alert_id=alert_id, db_url=url),
                     log=lambda _line: None)
    assert out.result.culprit == commits[4]
    with open_db(url) as db:
        assert get_alert(db, alert_id).culprit_commit == commits[4]
        with db.session() as s:
            runs = s.query(Run).order_by(Run.created_at, Run.id).all()
            backfill = [r for r in runs if r.grids == [BACKFILL_GRID]]
            assert len(backfill) == sum(1 for _ in no_gpu_needed)
            assert all(t0 < r.created_at < t0 + timedelta(hours=6) for r in backfill)
            assert all(r.branch is None and r.env["backfill"]["alert"] == alert_id
                       for r in backfill)
            assert all(r.trusted and r.origin.startswith("bisect by ") for r in backfill)
        # the history sees the commits in the range's order
        series, _src = history_from_db(db, get_run(db, bad_id).gpu_model_key,
                                       upto_run_id=max(r.id for r in runs), kernels=[KERNEL])
        seen = [c for c, _m in next(iter(series.values()))]
        assert seen == [c for c in commits if c in seen]
        assert commits[4] in seen and commits[0] == seen[0]
        # a later gate run whose parent was only timed by bisect gets no backfill baseline
        later = _stored_run(db, "f" * 40, commits[4], t0 + timedelta(hours=7), 1.05,
                            ["smoke", "perf"])
        how, bases = baseline_runs(db, get_run(db, later), branch="main")
        assert all(b.grids != [BACKFILL_GRID] for b in bases), how


def test_the_child_discovers_the_worktrees_kernels_and_says_why_it_cannot_time(team_repo):
    """The real child in a worktree on a CPU machine: the team's variant is found from
    the worktree's pyproject (an unknown one is named as such); timing needs a GPU."""
    from harness.records.bisect_git import worktree

    repo, commits = team_repo
    with worktree(repo, commits[2]) as tree:
        def child(kernel: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-P", "-m", "harness.runs.bisect_measure", "--kernel",
                 kernel, "--cases", case_ids(1)[0], "--commit", commits[2],
                 "--out", str(tree / "r.json")], cwd=tree, capture_output=True, text=True,
                timeout=300)
        unknown = child("nobody")
        assert unknown.returncode == 2 and "unknown kernel(s) nobody" in unknown.stderr
        assert KERNEL in unknown.stderr  # the known names include the worktree's variant
        try:
            import torch

            has_gpu = torch.cuda.is_available()
        except ImportError:
            has_gpu = False
        if not has_gpu:
            proc = child(KERNEL)
            assert proc.returncode == 3 and "CUDA GPU" in proc.stderr
    assert not tree.exists()


# --------------------------------------------------------------------- the errors


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    rc = cli_main(["bisect", *args])
    err = capsys.readouterr().err.strip()
    return rc, err


def test_an_unknown_alert_is_one_line_exit_2(team_repo, tmp_path, capsys):
    from harness.records.db.store import open_db

    repo, _ = team_repo
    url = str(tmp_path / "r.sqlite")
    open_db(url).close()
    rc, err = run_cli(["--alert", "42", "--db", url, "--repo", str(repo)], capsys)
    assert rc == 2 and err == "fa-harness bisect: error: --alert 42: no alert 42"


def test_a_range_that_is_not_a_range_is_one_line_exit_2(team_repo, capsys):
    repo, commits = team_repo
    base = ["--kernel", KERNEL, "--cases", case_ids(1)[0], "--repo", str(repo)]
    rc, err = run_cli(["--good", commits[5], "--bad", commits[1], *base], capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"{commits[5][:12]} is not an ancestor of {commits[1][:12]}" in err
    rc, err = run_cli(["--good", commits[1], "--bad", commits[1], *base], capsys)
    assert rc == 2 and "not a range" in err
    rc, err = run_cli(["--good", "nosuchrev", *base], capsys)
    assert rc == 2 and "'nosuchrev' names no commit" in err


def test_a_dirty_checkout_is_one_line_exit_2(team_repo, capsys):
    repo, commits = team_repo
    (repo / "speed.txt").write_text("2.0\n")
    rc, err = run_cli(["--good", commits[0], "--kernel", KERNEL, "--cases",
                       case_ids(1)[0], "--repo", str(repo)], capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "uncommitted changes (speed.txt)" in err


def test_no_git_is_one_line_exit_2(team_repo, monkeypatch, tmp_path, capsys):
    repo, commits = team_repo
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    rc, err = run_cli(["--good", commits[0], "--kernel", KERNEL, "--cases",
                       case_ids(1)[0], "--repo", str(repo)], capsys)
    assert rc == 2 and err == ("fa-harness bisect: error: git not found on PATH: bisect "
                               "checks out commits with git")


def test_not_a_repository_and_unknown_cases_are_usage_errors(tmp_path, team_repo):
    repo, commits = team_repo
    with pytest.raises(BisectUsageError, match="not inside a git repository"):
        prepare(BisectRequest(repo=tmp_path, good="HEAD~1", kernel=KERNEL,
                              cases=case_ids(1)[0]))
    with pytest.raises(BisectUsageError, match="matches no case"):
        prepare(BisectRequest(repo=repo, good=commits[0], kernel=KERNEL, cases="zz*"))
    with pytest.raises(BisectUsageError, match="without --alert, name --kernel"):
        prepare(BisectRequest(repo=repo, good=commits[0]))
    p = prepare(BisectRequest(repo=repo, good=commits[0], kernel=KERNEL,
                              cases=case_ids(1)[0]))
    assert p.commits == commits  # --bad defaults to HEAD


def test_without_a_gpu_the_command_says_not_measured(team_repo, tmp_path, capsys):
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is here")
    except ImportError:
        pass
    repo, commits = team_repo
    rc, err = run_cli(["--good", commits[0], "--kernel", KERNEL, "--cases",
                       case_ids(1)[0], "--repo", str(repo)], capsys)
    assert rc == 3 and err.startswith("fa-harness bisect: not measured: no working CUDA GPU")
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_ci_bisect_bisects_the_ranged_alert_the_run_opened(team_repo, no_gpu_needed,
                                                           tmp_path, monkeypatch):
    """`ci --bisect` after the gate: the open alert this run opened, whose range spans
    several commits, gets its culprit; an alert of another run is left alone."""
    from types import SimpleNamespace

    from harness.records.alerts import get_alert
    from harness.records.db.models import AlertRow
    from harness.records.db.store import get_run, open_db
    from harness.runs.bisect_run import bisect_after_gate

    repo, commits = team_repo
    url = str(tmp_path / "r.sqlite")
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    with open_db(url) as db:
        _stored_run(db, commits[0], None, t0, 1.0, ["smoke", "perf"])
        bad_id = _stored_run(db, commits[-1], commits[-2], t0 + timedelta(hours=6), 1.05,
                             ["smoke", "perf"])
        gpu = get_run(db, bad_id).gpu_model_key
        ids = []
        with db.session() as s:
            for run_id in (bad_id, bad_id - 1):
                row = AlertRow(gpu_model_key=gpu, variant=KERNEL, pass_name="fwd",
                               kind="timing", verdict="regression", owned=True, state="open",
                               first_bad_commit=commits[-1], last_good_commit=commits[0],
                               first_run_id=run_id, last_run_id=run_id, cases=case_ids())
                s.add(row)
                s.flush()
                ids.append(row.id)
    monkeypatch.chdir(repo)
    out = SimpleNamespace(run_id=bad_id, record=SimpleNamespace(gpu_model_key=gpu))
    lines = bisect_after_gate(out, db_url=url, max_minutes=5.0, log=lambda _line: None)
    assert f"first bad commit: {commits[4]}" in "\n".join(lines), lines
    with open_db(url) as db:
        assert get_alert(db, ids[0]).culprit_commit == commits[4]
        assert get_alert(db, ids[1]).culprit_commit is None


def test_ci_bisect_minutes_must_be_positive(capsys):
    rc = cli_main(["ci", "--bisect", "0"])
    assert rc == 2 and "--bisect must be > 0 minutes" in capsys.readouterr().err


def test_bad_bounds_are_usage_errors(team_repo, capsys):
    repo, commits = team_repo
    base = ["--good", commits[0], "--kernel", KERNEL, "--cases", case_ids(1)[0],
            "--repo", str(repo)]
    for extra, msg in ((["--runs", "9"], "--runs must be 1 to 5"),
                       (["--end-runs", "0"], "--end-runs must be >= 1"),
                       (["--max-minutes", "0"], "--max-minutes must be > 0"),
                       (["--max-builds", "2"], "--max-builds 2: the two ends")):
        rc, err = run_cli([*base, *extra], capsys)
        assert rc == 2 and msg in err, (extra, err)
