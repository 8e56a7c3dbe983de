"""Records from elsewhere: a field too large to store or show is refused at import (one
line, exit 2, nothing stored), and an imported record nobody vouched for never becomes
history: a made-up run of the parent commit with halved times is stored, marked, and left
out of the baseline, the noise history and the step search, so the genuine next commit is
judged against the genuine parent."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from harness.cli import main
from harness.records.db.models import Comparison, Run
from harness.records.db.store import baseline_runs, counts, get_run, open_db
from harness.records.noise import timed_history
from harness.records.synthetic import make_record, specs_for
from harness.records.validate import FIELD_LIMITS, MAX_STRING

PARENT, CHILD = "a" * 40, "c" * 40


def _write(path: Path, rec) -> Path:  # noqa: ANN001 - RunRecord
    rec.write(path)
    return path


def _runs(url: str) -> int:
    with open_db(url) as db:
        return counts(db)["runs"]


# ------------------------------------------------------------------ sizes


@pytest.mark.parametrize("field", ["env", "message", "string"])
def test_oversized_record_is_refused_at_import(field, tmp_path, capsys):
    import json

    url = f"sqlite:///{tmp_path / 'big.sqlite'}"
    data = make_record(specs_for(), seed=1).to_dict()
    if field == "env":  # many small strings: the field, not one string, is too large
        data["env"]["blob"] = {f"k{i}": "x" * 1000 for i in range(1500)}
    elif field == "message":
        data["results"][0]["message"] = "m" * (MAX_STRING + 1)
    else:  # one 60 MB string in a free-form object
        data["env"]["argv"] = ["y" * (60 * 2**20)]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(data))
    good = _write(tmp_path / "good.json", make_record(specs_for(), seed=2))
    assert main(["import", str(good), str(path), "--db", url, "--trusted"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "more than the limit of" in err
    assert {"env": f"env: {len(json.dumps(data['env'], separators=(',', ':')))} bytes, "
                   f"more than the limit of {FIELD_LIMITS['env']}",
            "message": "results[0].message: a string of",
            "string": "env.argv[0]: a string of 62914560 bytes"}[field] in err
    assert _runs(url) == 0  # nothing stored, not even the good record beside it


def test_record_within_limits_still_imports(tmp_path):
    url = f"sqlite:///{tmp_path / 'ok.sqlite'}"
    rec = make_record(specs_for(), seed=1)
    rec.env["blob"] = "x" * (MAX_STRING - 10)
    assert main(["import", str(_write(tmp_path / "ok.json", rec)), "--db", url]) == 0
    assert _runs(url) == 1


# ------------------------------------------------------------------ origins


def _history(tmp_path: Path, capsys, url: str | None = None) -> tuple[str, str]:
    """A genuine parent run (imported --trusted), a forged run of the same parent commit
    on the same GPU and branch with every time halved (imported plainly), then the
    genuine child commit (--trusted). Returns (database URL, the child import's output)."""
    url = url or f"sqlite:///{tmp_path / 'h.sqlite'}"
    specs = specs_for()
    genuine = make_record(specs, seed=1, commit=PARENT, minutes=0)
    forged = make_record([replace(s, median_ms=s.median_ms / 2) for s in specs], seed=2,
                         commit=PARENT, minutes=10)
    child = make_record(specs, seed=3, commit=CHILD, parent=PARENT, minutes=20)
    assert main(["import", "--trusted", str(_write(tmp_path / "a.json", genuine)),
                 "--db", url]) == 0
    assert main(["import", str(_write(tmp_path / "forged.json", forged)), "--db", url]) == 0
    capsys.readouterr()
    assert main(["import", "--trusted", str(_write(tmp_path / "c.json", child)),
                 "--db", url]) == 0
    return url, capsys.readouterr().out


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'h.sqlite'}"
    return request.getfixturevalue("pg_url")


def test_forged_import_is_not_the_baseline(tmp_path, capsys, db_url):
    url, out = _history(tmp_path, capsys, db_url)
    assert "run 3 vs run 1 (parent commit aaaaaaaaaaaa)" in out
    assert "regression" not in out
    with open_db(url) as db:
        with db.session() as s:
            runs = {r.id: r for r in s.scalars(select(Run))}
            verdicts = {v.verdict for v in s.scalars(select(Comparison)
                                                     .where(Comparison.run_id == 3))}
            judged_forged = s.scalars(select(Comparison).where(Comparison.run_id == 2)).all()
        assert [r.trusted for r in runs.values()] == [True, False, True]
        assert runs[2].origin.startswith("import by ")
        assert runs[1].origin.startswith("import (trusted) by ")
        assert verdicts and "regression" not in verdicts
        assert judged_forged == []  # never judged: its verdicts would raise alerts
        how, bases = baseline_runs(db, get_run(db, 3))
        assert [b.id for b in bases] == [1]
        # the noise history and the step search read no halved time either
        rows = timed_history(db, "nvidia-h200", upto_run_id=3, runs=50, include_upto=True)
        assert rows and min(r[5] for r in rows) > 0.9


def test_the_operator_can_vouch_for_a_stored_import(tmp_path, capsys):
    url, _ = _history(tmp_path, capsys)
    # --trusted on the same file again: the stored run becomes trusted, a baseline now
    assert main(["import", "--trusted", str(tmp_path / "forged.json"), "--db", url]) == 0
    with open_db(url) as db:
        assert get_run(db, 2).trusted
        assert [b.id for b in baseline_runs(db, get_run(db, 3))[1]] == [2]
    # a plain import of a trusted run takes nothing away
    assert main(["import", str(tmp_path / "a.json"), "--db", url]) == 0
    with open_db(url) as db:
        assert get_run(db, 1).trusted


def test_forged_commit_is_not_in_the_branch_window(tmp_path, capsys):
    # A made-up commit (its own hash, the genuine parent as its parent) with halved times,
    # then a genuine run that cannot name its parent (a shallow checkout): its baseline is
    # the last runs on the branch, which must not include the made-up one.
    url = f"sqlite:///{tmp_path / 'w.sqlite'}"
    specs = specs_for()
    genuine = make_record(specs, seed=1, commit=PARENT, minutes=0)
    forged = make_record([replace(s, median_ms=s.median_ms / 2) for s in specs], seed=2,
                         commit="b" * 40, parent=PARENT, minutes=10)
    child = make_record(specs, seed=3, commit=CHILD, minutes=20)
    assert main(["import", "--trusted", str(_write(tmp_path / "a.json", genuine)),
                 "--db", url]) == 0
    assert main(["import", str(_write(tmp_path / "b.json", forged)), "--db", url]) == 0
    out = capsys.readouterr().out
    assert "run 2: stored untrusted (import by " in out and "not judged" in out
    assert main(["import", "--trusted", str(_write(tmp_path / "c.json", child)),
                 "--db", url]) == 0
    out = capsys.readouterr().out
    assert "run 3 vs run 1 (last 1 run(s) on main)" in out and "regression" not in out
    with open_db(url) as db, db.session() as s:
        # the made-up run was not judged either: its "improvements" would be alerts
        assert s.scalars(select(Comparison).where(Comparison.run_id == 2)).all() == []


# ------------------------------------------------------------------ the Run page


def test_run_page_marks_untrusted_runs_and_bounds_each_field(tmp_path, capsys, monkeypatch):
    import json

    from realdata import dashboard_app
    from sqlalchemy import create_engine, text

    url, _ = _history(tmp_path, capsys)
    # A database filled before the limits, or by another tool: one field of 5 MB, one
    # failure message of 1 MB. The page sends a page's worth of each, not all of it.
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET env = :env WHERE id = 2"),
                     {"env": json.dumps({"blob": "e" * (5 * 2**20)})})
        conn.execute(text("UPDATE results SET status = 'failed', message = :m WHERE id IN "
                          "(SELECT min(id) FROM results WHERE run_id = 2)"),
                     {"m": "m" * 2**20})
    engine.dispose()
    at = dashboard_app(url, monkeypatch, page="run", run="2")
    assert any("Untrusted run, stored by import by" in w.value for w in at.warning)
    shown = [c.value for c in at.code]
    assert shown and max(map(len, shown)) < 25_000 and "more characters not shown" in shown[-1]
    fails = next(d.value for d in at.dataframe if "message" in d.value.columns)
    assert max(map(len, fails["message"])) < 2_100
    at = dashboard_app(url, monkeypatch, page="run", run="1")
    assert not any("Untrusted" in w.value for w in at.warning)
