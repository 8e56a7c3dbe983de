"""A submission's backward through the real worker (its scoring child), the database
entry it becomes, and the backward board: `fa-harness leaderboard` (JSON, and a table
through a pipe at 80 columns) and the dashboard's Leaderboard page; old databases.

The child scores Python candidates (tests.test_submit_backward_scoring) chosen by the
job's one file, through the same `score_passes` as the worker's default scorer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from harness.cli import main
from harness.records.db import open_db
from harness.records.db.models import Submission, SubmissionPass
from harness.submissions.ranking import leaderboard_rows
from harness.submissions.worker import WorkerConfig, work

ROOT = Path(__file__).resolve().parents[1]
SCORER = "tests.test_submit_backward_worker:scorer"


def scorer(files, options, *, secret, progress, checkpoint=None):
    """Runs in the worker's child: the job's mode.txt picks the candidate."""
    from harness.core.candidate import Support
    from harness.submissions.scoring_bwd import score_passes
    from tests.test_submit_backward_scoring import Exact

    class Hangs(Exact):
        def run_backward(self, case, inputs, dq, dk, dv) -> None:
            time.sleep(3600)  # a backward kernel that never returns

    class Segfaults(Exact):
        def run_backward(self, case, inputs, dq, dk, dv) -> None:
            os.kill(os.getpid(), signal.SIGSEGV)  # takes the scoring process down

    mode = files["mode.txt"].strip()
    cand = {"ok": Exact(name="ok"), "nogroup": Exact(bad_bwd="no_group_sum"),
            "hang": Hangs(), "segv": Segfaults(),
            "fwd_only": Exact(support=Support())}[mode]
    return score_passes(cand, options, secret=secret, baseline=Exact(name="base"),
                        progress=progress, checkpoint=checkpoint)


@pytest.fixture
def db(tmp_path):
    d = open_db(str(tmp_path / "b.sqlite"))
    yield d
    d.close()


def _add(db, mode: str) -> int:
    with db.session() as s:
        row = Submission(name=f"k_{mode}", submitter="t", source=json.dumps({"mode.txt": mode}),
                         source_hash=mode, status="queued")
        s.add(row)
        s.flush()
        return row.id


def _config() -> WorkerConfig:
    from test_submit_backward_scoring import options  # tests/ is on pytest's path

    return WorkerConfig(gpu=None, case_timeout_s=8.0, job_timeout_s=300.0,
                        memory_limit_mb=4000, gpu_memory_fraction=None, scorer=SCORER,
                        secret=31337, scoring=options().to_dict(), poll_s=0.1)


def test_the_worker_stores_the_backward_as_its_own_entry_and_never_loses_the_forward(db):
    ids = {m: _add(db, m) for m in ("ok", "nogroup", "hang", "segv", "fwd_only")}
    logs: list[str] = []
    assert work(db.engine, _config(), drain=True, log=logs.append) == len(ids)
    with db.sessions() as s:
        subs = {r.id: r for r in s.scalars(select(Submission))}
        passes = {r.submission_id: r for r in s.scalars(select(SubmissionPass))}
    # Every forward is scored, whatever its backward did (hung, killed the process).
    for mode, sid in ids.items():
        assert (subs[sid].status, subs[sid].verdict) == ("done", "scored"), (mode,
                                                                            subs[sid].message)
        assert subs[sid].score is not None and subs[sid].score > 0
    assert ids["fwd_only"] not in passes
    got = {mode: passes[sid] for mode, sid in ids.items() if mode != "fwd_only"}
    assert {m: p.pass_name for m, p in got.items()} == dict.fromkeys(got, "bwd")
    assert got["ok"].verdict == "scored" and got["ok"].score > 0
    assert got["ok"].detail["coverage"]["timed"] == 2
    assert got["nogroup"].verdict == "incorrect" and "dk" in got["nogroup"].message
    assert got["hang"].verdict == "timeout" and "no progress" in got["hang"].message
    assert "check-bwd" in got["hang"].message
    assert got["segv"].verdict == "crashed" and "SIGSEGV" in got["segv"].message
    assert any("backward scored" in line for line in logs)

    # The boards: each pass ranked on its own.
    fwd = leaderboard_rows(db.engine)
    bwd = leaderboard_rows(db.engine, pass_name="bwd", include_all=True)
    assert len(fwd) == 5 and all(r["pass"] == "fwd" for r in fwd)
    assert [(r["name"], r["rank"]) for r in bwd if r["rank"]] == [("k_ok", 1)]
    assert sorted(r["verdict"] for r in bwd if not r["rank"]) == ["crashed", "incorrect",
                                                                  "timeout"]
    assert main(["leaderboard", "--db", db.url, "--json"]) == 0


def _board_db(tmp_path) -> str:
    """A database with forward and backward entries, as the worker leaves it."""
    path = tmp_path / "board.sqlite"
    with open_db(str(path)) as d, d.session() as s:
        for i, (name, score, bwd) in enumerate([
                ("fwd_and_bwd_kernel", 1.4, ("scored", 0.9)),
                ("forward_only_kernel", 2.0, None),
                ("bwd_is_wrong_kernel", 1.1, ("incorrect", None))]):
            row = Submission(name=name, submitter="alice", source="{}", source_hash=str(i),
                             status="done", verdict="scored", score=score, message="ok",
                             detail={"coverage": {"timed": 48, "of": 48}})
            s.add(row)
            s.flush()
            if bwd:
                s.add(SubmissionPass(submission_id=row.id, pass_name="bwd", verdict=bwd[0],
                                     score=bwd[1], message="dk: max error 0.5 at [0, 0, 3]",
                                     detail={"coverage": {"timed": 40, "of": 40}}))
    return str(path)


def test_leaderboard_shows_both_boards_through_a_pipe_at_80_columns(tmp_path, capsys):
    path = _board_db(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("LINES", "FA_HARNESS_DB")}
    env.update(COLUMNS="80", FA_HARNESS_HOME=str(tmp_path))
    proc = subprocess.run(f"{sys.executable} -m harness leaderboard --all --db {path} | cat",
                          shell=True, env=env, text=True, capture_output=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    out = proc.stdout
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "leaderboard: forward" in out and "leaderboard: backward" in out
    fwd, bwd = out.split("leaderboard: backward")
    for name in ("fwd_and_bwd_kernel", "forward_only_kernel", "bwd_is_wrong_kernel"):
        assert name in fwd  # whole, not folded
    assert "fwd_and_bwd_kernel" in bwd and "0.900x" in bwd and "40/40" in bwd
    assert "bwd_is_wrong_kernel" in bwd and "forward_only_kernel" not in bwd

    assert main(["leaderboard", "--db", path, "--json", "--pass", "bwd", "--all"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["pass"], r["name"], r["rank"]) for r in rows] == [
        ("bwd", "fwd_and_bwd_kernel", 1), ("bwd", "bwd_is_wrong_kernel", None)]
    assert main(["leaderboard", "--db", path, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["pass"], r["name"]) for r in rows] == [
        ("fwd", "forward_only_kernel"), ("fwd", "fwd_and_bwd_kernel"),
        ("fwd", "bwd_is_wrong_kernel"), ("bwd", "fwd_and_bwd_kernel")]
    assert main(["leaderboard", "--db", path, "--pass", "fwd"]) == 0
    assert "backward" not in capsys.readouterr().out


def test_the_dashboard_shows_the_backward_board_beside_the_forwards(tmp_path, monkeypatch):
    pytest.importorskip("streamlit.testing.v1")
    import realdata

    at = realdata.dashboard_app(f"sqlite:///{_board_db(tmp_path)}", monkeypatch,
                                page="leaderboard")
    assert [s.value for s in at.subheader][:2] == ["Forward", "Backward"]
    forward, backward = at.dataframe[0].value, at.dataframe[1].value
    assert list(forward["name"]) == ["forward_only_kernel", "fwd_and_bwd_kernel",
                                     "bwd_is_wrong_kernel"]
    assert list(backward["name"]) == ["fwd_and_bwd_kernel"]
    assert list(backward["coverage"]) == ["40/40"]
    assert "bwd_is_wrong_kernel" in list(at.dataframe[2].value["name"])


def test_an_old_database_keeps_working(tmp_path):
    """A database from before backward entries (revision 0004) with a scored submission:
    read as it is, the backward board is empty; upgraded (as opening a SQLite file does),
    its rows are unchanged and the new entries can be written."""
    from harness.records.db import migrate

    path = tmp_path / "old.sqlite"
    with open_db(str(path)) as d:
        migrate.downgrade(d.engine, "0004")
        with d.engine.begin() as conn:
            conn.execute(Submission.__table__.insert(), [{
                "name": "old_kernel", "submitter": "t", "source": "{}", "source_hash": "h",
                "status": "done", "verdict": "scored", "score": 1.25, "attempts": 1,
                "created_at": Submission.created_at.default.arg(None),
                "detail": {"coverage": {"timed": 48, "of": 48}}}])
        assert leaderboard_rows(d.engine, pass_name="bwd") == []
        assert [r["name"] for r in leaderboard_rows(d.engine)] == ["old_kernel"]
    with open_db(str(path)) as d:  # upgraded to head on opening
        with d.engine.connect() as conn:
            assert migrate.current_revision(conn) == migrate.head_revision()
        assert [(r["name"], r["score"]) for r in leaderboard_rows(d.engine)] == [
            ("old_kernel", 1.25)]
        assert leaderboard_rows(d.engine, pass_name="bwd") == []


def test_a_job_scored_again_replaces_its_backward_entry(db):
    from sqlalchemy import update

    from harness.submissions.queue import Outcome, claim, finish

    sid = _add(db, "ok")
    job = claim(db.engine, "w1")
    assert finish(db.engine, job, Outcome("scored", "f", score=1.0,
                                          backward=Outcome("scored", "b", score=2.0)))
    with db.session() as s:  # queued again (an operator's re-run)
        s.execute(update(Submission).where(Submission.id == sid).values(status="queued"))
    job = claim(db.engine, "w2")
    assert finish(db.engine, job, Outcome("scored", "f", score=1.1,
                                          backward=Outcome("incorrect", "dk wrong")))
    with db.sessions() as s:
        entries = s.scalars(select(SubmissionPass)).all()
    assert [(e.submission_id, e.verdict, e.score) for e in entries] == [(sid, "incorrect",
                                                                         None)]
    # a lost claim writes neither the forward nor the backward
    assert not finish(db.engine, job, Outcome("scored", "late", score=9.0,
                                              backward=Outcome("scored", "late", score=9.0)))
    with db.sessions() as s:
        assert [e.verdict for e in s.scalars(select(SubmissionPass))] == ["incorrect"]


def test_submit_wait_prints_the_backward_verdict_after_the_forwards(tmp_path, capsys):
    from harness.cli.cmd_submit import _wait

    path = _board_db(tmp_path)
    with open_db(path) as d:
        assert _wait(d.engine, 3, timeout=5) == 0  # the forward's verdict decides
        assert _wait(d.engine, 2, timeout=5) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("submission 3: scored score 1.1000")
    assert out[1].startswith("submission 3 backward: incorrect: dk: max error")
    assert out[2].startswith("submission 2: scored") and len(out) == 3
