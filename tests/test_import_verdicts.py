"""`fa-harness import` judges each newly stored run against its baseline, as `ci` does,
and `ci` records the repository's web address for commit links."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import realdata
from sqlalchemy import select

from harness.cli import main
from harness.records.compare import compare_records
from harness.records.db.models import Comparison
from harness.records.db.store import open_db
from harness.records.record import RunRecord, git_metadata


def _verdicts(url: str) -> dict[int, dict[tuple[str, str], str]]:
    db = open_db(url)
    try:
        with db.session() as s:
            rows = s.execute(select(Comparison.run_id, Comparison.variant, Comparison.case_id,
                                    Comparison.verdict)).all()
    finally:
        db.close()
    out: dict[int, dict[tuple[str, str], str]] = {}
    for run_id, variant, case_id, verdict in rows:
        out.setdefault(run_id, {})[(variant, case_id)] = verdict
    return out


def test_import_judges_against_the_parent_run(tmp_path: Path, capsys) -> None:
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    assert main(["import", "--trusted", str(realdata.PERF), "--db", url]) == 0
    assert _verdicts(url) == {}  # nothing earlier to compare the first run with
    perf = realdata.load(realdata.PERF)
    child = realdata.derive(perf, hours=24, commit=realdata.CHILD, parent=perf["commit"])
    realdata.slower(child, realdata.SLOWED, 1.3)
    path = tmp_path / "child.json"
    path.write_text(json.dumps(child))
    capsys.readouterr()
    assert main(["import", "--trusted", str(path), "--db", url]) == 0
    out = capsys.readouterr().out
    assert "run 2 vs run 1 (parent commit 0de44870b35a): regression 48" in out
    # Exactly the verdicts `fa-harness ci` / `fa-harness compare` give for the same pair.
    want = compare_records(RunRecord.from_dict(perf), RunRecord.from_dict(child))
    stored = _verdicts(url)
    assert stored[2] == {(v.variant, v.case_id): v.verdict for v in want.verdicts}
    assert {v for (k, _), v in stored[2].items() if k == realdata.SLOWED} == {"regression"}
    # Importing again stores nothing and judges nothing twice.
    assert main(["import", "--trusted", str(path), "--db", url]) == 0
    assert _verdicts(url) == stored


def test_import_of_a_directory_chains_in_time_order(tmp_path: Path, capsys) -> None:
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    perf = realdata.load(realdata.PERF)
    a = realdata.derive(perf, hours=24, commit="a" * 40, parent=perf["commit"])
    b = realdata.derive(perf, hours=48, commit="b" * 40, parent="a" * 40)
    realdata.slower(b, realdata.SLOWED, 1.3)
    d = tmp_path / "recs"
    d.mkdir()
    # File names in the opposite order of the runs: the judging follows run time.
    (d / "1.json").write_text(json.dumps(b))
    (d / "2.json").write_text(json.dumps(a))
    (d / "3.json").write_text(json.dumps(perf))
    assert main(["import", "--trusted", str(d), "--db", url]) == 0
    stored = _verdicts(url)
    by_uuid = {}
    db = open_db(url)
    try:
        from harness.records.db.models import Run

        with db.session() as s:
            by_uuid = dict(s.execute(select(Run.uuid, Run.id)).all())
    finally:
        db.close()
    assert by_uuid[perf["uuid"]] not in stored
    assert set(stored[by_uuid[a["uuid"]]].values()) <= {"same", "inconclusive"}
    assert "regression" in stored[by_uuid[b["uuid"]]].values()


@pytest.mark.parametrize(("env", "want"), [
    ({"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "acme/fa"},
     "https://github.com/acme/fa"),
    ({"CI_PROJECT_URL": "https://gitlab.example.com/group/fa"},
     "https://gitlab.example.com/group/fa"),
    ({}, None),
])
def test_ci_records_the_repository_url(env: dict[str, str], want: str | None,
                                       monkeypatch) -> None:
    for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "CI_PROJECT_URL"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert git_metadata().get("repository_url") == want
    rec = RunRecord.from_results([], {"source": "ci"})
    assert (rec.env or {}).get("repository_url") == want
