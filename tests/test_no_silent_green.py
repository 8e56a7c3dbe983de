"""No silent green, no traceback: a gate with nothing of the team's to judge is not a
pass, a failing run exports, a damaged database is one line, an interrupted import stores
no run without its verdicts, and Ctrl-C says so."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select, update

from harness.cli import main
from harness.records.db.models import Comparison, Result, Run
from harness.records.db.store import open_db, store_record
from harness.records.record import RunRecord
from harness.records.synthetic import make_record, specs_for


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "FA_HARNESS_HOME": str(home)}
    for key in ("FA_HARNESS_DB", "FA_HARNESS_KERNELS", "FA_HARNESS_DISCOVERY"):
        env.pop(key, None)
    return env


def _one_line(err: str, needle: str) -> None:
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err


# ------------------------------------------------------------------ ci: nothing to judge


@pytest.mark.slow
def test_ci_with_nothing_of_the_teams_to_judge_is_not_a_pass(tmp_path):
    """An empty [tool.fa-harness] (no kernel folder, no candidate): only the shipped
    yardsticks are found, and the gate said "passed" (exit 0) having judged nothing."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "team"\n\n[tool.fa-harness]\n')
    db = tmp_path / "ci.sqlite"
    args = [sys.executable, "-m", "harness", "ci", "--grid", "smoke", "--db", str(db)]
    proc = subprocess.run(args, cwd=tmp_path, env=_env(tmp_path), text=True,
                          capture_output=True, timeout=600)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr
    _one_line(proc.stderr, "nothing of the team's was found to judge")
    assert proc.stdout == "" and not db.exists()
    # Naming what to time makes it the team's: the gate runs and judges it.
    proc = subprocess.run([*args, "--kernels", "naive_model"], cwd=tmp_path,
                          env=_env(tmp_path), text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    assert "fa-harness CI: passed" in proc.stdout


# ------------------------------------------------------------- inf/NaN: export, import


def _failing_record() -> RunRecord:
    data = make_record(specs_for(), seed=7).to_dict()
    bad = data["results"][0]
    bad["status"] = "failed"
    bad["message"] = "lse: inf where the oracle is finite"
    bad["errors"] = {"out_err": "nan", "base_err": 0.001, "ratio": "nan", "lse_err": "inf",
                     "lse_base_err": "-inf"}
    return RunRecord.from_dict(data)


def test_a_failing_run_with_inf_and_nan_exports_and_imports_back(tmp_path, capsys):
    """`export --run latest` of a failing run was a traceback (`lse_err: inf is not a JSON
    number`), and a NaN error came back as null (SQLite stores NaN as NULL)."""
    record = _failing_record()
    src = record.write(tmp_path / "run.json")
    db = str(tmp_path / "a.sqlite")
    assert main(["import", str(src), "--db", db]) == 0
    out = tmp_path / "out.json"
    assert main(["export", "--run", "latest", "-o", str(out), "--db", db]) == 0
    back = RunRecord.read(out)
    assert back.results[0]["errors"] == record.results[0]["errors"]
    assert back.sha256() == record.sha256()
    capsys.readouterr()
    # The exported file is the same run to the database it came from ...
    assert main(["import", str(out), "--db", db]) == 0
    assert "(already stored)" in capsys.readouterr().out
    # ... and to another one, which exports it byte for byte the same.
    other = str(tmp_path / "b.sqlite")
    assert main(["import", str(out), "--db", other]) == 0
    again = tmp_path / "again.json"
    assert main(["export", "--run", "latest", "-o", str(again), "--db", other]) == 0
    assert again.read_bytes() == out.read_bytes()


def test_an_infinite_error_stored_only_in_its_column_exports_as_the_format_says(tmp_path):
    """A run stored before the spelling was kept beside the column: the column's float
    inf is written "inf"."""
    db_path = tmp_path / "old.sqlite"
    with open_db(str(db_path)) as db:
        run_id = store_record(db, make_record(specs_for(), seed=3))
        with db.session() as s:
            s.execute(update(Result).where(Result.run_id == run_id)
                      .values(lse_err=float("inf"), err_ratio=float("-inf")))
    out = tmp_path / "old.json"
    assert main(["export", "--run", str(run_id), "-o", str(out), "--db", str(db_path)]) == 0
    errors = json.loads(out.read_text())["results"][0]["errors"]
    assert errors["lse_err"] == "inf" and errors["ratio"] == "-inf"


# ------------------------------------------------------------------- damaged database


def _stored_db(path: Path, runs: int = 3) -> Path:
    with open_db(str(path)) as db:
        for i in range(runs):
            store_record(db, make_record(specs_for(), seed=i, minutes=i))
    con = sqlite3.connect(path)  # everything in the main file: no WAL left beside it
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path


def _garbage(path: Path, offset: int, size: int = 4096) -> None:
    rng = random.Random(offset)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(rng.getrandbits(8) for _ in range(size)))


def _page_of(path: Path, table: str) -> tuple[int, int]:
    """(offset, size) of the root page of `table`'s b-tree."""
    con = sqlite3.connect(path)
    try:
        size = con.execute("PRAGMA page_size").fetchone()[0]
        root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?",
                           (table,)).fetchone()[0]
    finally:
        con.close()
    return (root - 1) * size, size


def _damage_line(capsys, argv: list[str], db: Path) -> str:
    assert main([*argv, "--db", str(db)]) == 2, argv
    err = capsys.readouterr().err
    _one_line(err, "is damaged")
    assert err.isascii() and len(err) < 400, err  # names the problem, not the bytes
    return err


def test_db_current_checks_the_whole_file(tmp_path, capsys):
    """Garbage over pages its queries never read (here the alerts table's): `db current`
    said all was fine; 4 KiB of garbage over the middle of the file is found as well."""
    db = _stored_db(tmp_path / "r.sqlite")
    assert main(["db", "current", "--db", str(db)]) == 0
    capsys.readouterr()
    middle = tmp_path / "middle.sqlite"
    middle.write_bytes(db.read_bytes())
    _garbage(middle, middle.stat().st_size // 2 - 2048)
    _damage_line(capsys, ["db", "current"], middle)
    _garbage(db, *_page_of(db, "alerts"))
    _damage_line(capsys, ["db", "current"], db)


def test_damage_met_in_the_middle_of_a_command_is_one_line(tmp_path, capsys):
    """The results table's pages damaged: the database opens, and `export` and `compare`
    met the damage while reading the run (a 60-line driver traceback)."""
    db = _stored_db(tmp_path / "r.sqlite")
    offset, size = _page_of(db, "results")
    _garbage(db, offset, size)
    for argv in (["export", "--run", "latest", "-o", str(tmp_path / "x.json")],
                 ["compare", "1", "latest"], ["db", "current"],
                 ["import", str(_failing_record().write(tmp_path / "new.json"))]):
        _damage_line(capsys, argv, db)
    assert not (tmp_path / "x.json").exists()


def test_a_file_of_random_bytes_is_one_line_everywhere(tmp_path, capsys):
    db = tmp_path / "noise.sqlite"
    db.write_bytes(random.Random(1).randbytes(64 * 1024))
    for argv in (["db", "current"], ["export", "--run", "latest", "-o", "x.json"],
                 ["compare", "1", "latest"], ["leaderboard"]):
        assert "not a database" in _damage_line(capsys, argv, db)


# ---------------------------------------------------------------------------- Ctrl-C

# Runs `fa-harness import`, sending this process SIGINT (Ctrl-C) when the second run's
# verdicts are about to be stored.
_INTERRUPTED_IMPORT = """
import os, signal, sys
import harness.records.db.store as store
real, calls = store.store_comparisons, []
def store_comparisons(*args, **kw):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kw)
store.store_comparisons = store_comparisons
from harness.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _chain(n: int) -> list[RunRecord]:
    """n runs of consecutive commits on main, each the parent of the next."""
    commits = [f"{i:x}" * 40 for i in range(1, n + 1)]
    return [make_record(specs_for(), seed=10 + i, commit=c, minutes=10 * i,
                        parent=commits[i - 1] if i else None)
            for i, c in enumerate(commits)]


def test_ctrl_c_during_import_stores_no_run_without_its_verdicts(tmp_path):
    """Ctrl-C while an import judged its runs left runs committed without verdicts."""
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    base, *rest = _chain(5)
    assert main(["import", "--trusted", str(base.write(tmp_path / "0.json")), "--db", url]) == 0
    files = [str(r.write(tmp_path / "new" / f"{i}.json")) for i, r in enumerate(rest)]
    proc = subprocess.run([sys.executable, "-c", _INTERRUPTED_IMPORT, "import", "--trusted",
                           *files, "--db", url], env=_env(tmp_path), text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    _one_line(proc.stderr, "interrupted")
    with open_db(url) as db, db.session() as s:
        runs = s.execute(select(Run.id)).scalars().all()
        judged = set(s.execute(select(Comparison.run_id)).scalars())
    # Every stored run that has a run before it (all but the first) has its verdicts.
    assert set(runs[1:]) <= judged, (runs, judged)
    # Run again, the import stores and judges them all.
    assert main(["import", "--trusted", *files, "--db", url]) == 0
    with open_db(url) as db, db.session() as s:
        assert len(s.execute(select(Run.id)).all()) == 5
        assert len(set(s.execute(select(Comparison.run_id)).scalars())) == 4


def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "--kernels",
                             "naive_model,fa2_model,sdpa_math", "--no-store", "--no-progress"],
                            env=_env(tmp_path), cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline()  # the command is running
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    _one_line(err, "fa-harness run: interrupted")
