"""Records as an attacker (or a broken tool) writes them, on SQLite and on PostgreSQL: the
same refusal on both (one line, exit 2, nothing stored), never a traceback, never stored
on one database and refused by the other; the spool goes on past a record that cannot be
stored; a directory import stores all or nothing; only regular files of bounded size are
read."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from harness.cli import main as cli_main
from harness.records.db.store import counts, import_spool, open_db
from harness.records.record import RunRecord, spool, spooled
from harness.records.synthetic import make_record, specs_for
from harness.records.validate import schema, validate


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'r.sqlite'}"
    return request.getfixturevalue("pg_url")


def _good(seed: int = 1, **kw) -> dict:
    return make_record(specs_for(), seed=seed, minutes=seed, **kw).to_dict()


def _runs(url: str) -> int:
    with open_db(url) as db:
        return counts(db)["runs"]


def _import(url: str, *paths: str | Path, capsys) -> tuple[int, str, str]:
    rc = cli_main(["import", "--db", url, *map(str, paths)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _hostile() -> dict[str, str]:
    """name -> file text; each must be refused by the reader or the validation."""
    good = json.dumps(_good())
    d = _good()
    cases = {
        "nan_literal": good.replace('"median_ms": ', '"median_ms": NaN, "x": ', 1),
        "infinity_literal": good.replace('"tflops": ', '"tflops": Infinity, "y": ', 1),
    }

    def variant(name: str, change) -> None:
        x = json.loads(good)
        change(x)
        cases[name] = json.dumps(x)

    variant("int_over_64_bits_column", lambda x: x["results"][0].update(flops=2**64))
    variant("int_over_64_bits_free_form", lambda x: x["env"].update(big=2**70))
    variant("branch_300_chars", lambda x: x.update(branch="b" * 300))
    variant("kernel_300_chars", lambda x: x["results"][0].update(kernel="k" * 300))
    variant("nul_in_branch", lambda x: x.update(branch="ma\x00in"))
    variant("median_is_text", lambda x: x["results"][0].update(median_ms="fast"))
    variant("samples_negative", lambda x: x["results"][0].update(samples_ms=[-1.0]))
    variant("batch_is_bool", lambda x: x["results"][0]["case"].update(batch=True))
    variant("gpu_is_list", lambda x: x.update(gpu=[1, 2]))
    variant("results_is_object", lambda x: x.update(results={}))
    variant("seed_over_64_bits", lambda x: x["results"][0]["case"].update(seed=2**63))
    variant("extra_nested_100", lambda x: x["results"][0].update(
        extra=json.loads("[" * 100 + "]" * 100)))
    cases["deep_100k"] = good[:-1] + ', "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"
    cases["huge_int_literal"] = good.replace('"flops": ', '"flops": ' + "9" * 5000 + ', "z": ',
                                             1)
    assert d  # the base record itself is valid
    return cases


HOSTILE = _hostile()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_record_refused_the_same_on_both_databases(name, url, tmp_path, capsys):
    f = tmp_path / f"{name}.json"
    f.write_text(HOSTILE[name], encoding="utf-8")
    rc, out, err = _import(url, f, capsys=capsys)
    assert rc == 2, (out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert len(err) < 600  # one readable line, not an echo of the file
    assert _runs(url) == 0


def test_the_base_record_of_the_hostile_cases_is_stored(url, tmp_path, capsys):
    f = tmp_path / "good.json"
    f.write_text(json.dumps(_good()))
    assert _import(url, f, capsys=capsys)[0] == 0 and _runs(url) == 1


def test_uppercase_copy_of_a_stored_uuid_is_the_same_run(url, tmp_path, capsys):
    d = _good()
    (tmp_path / "a.json").write_text(json.dumps(d))
    upper = dict(d, uuid=d["uuid"].upper())
    (tmp_path / "b.json").write_text(json.dumps(upper))
    braced = dict(d, uuid="{" + d["uuid"] + "}")
    (tmp_path / "c.json").write_text(json.dumps(braced))
    assert _import(url, tmp_path / "a.json", capsys=capsys)[0] == 0
    rc, out, _ = _import(url, tmp_path / "b.json", tmp_path / "c.json", capsys=capsys)
    assert rc == 0 and out.count("(already stored)") == 2
    assert _runs(url) == 1


def test_directory_import_with_a_conflict_stores_nothing(url, tmp_path, capsys):
    d = tmp_path / "records"
    d.mkdir()
    first = _good(1)
    (d / "1.json").write_text(json.dumps(first))
    assert _import(url, d / "1.json", capsys=capsys)[0] == 0
    (d / "2.json").write_text(json.dumps(_good(2)))
    (d / "3.json").write_text(json.dumps(dict(first, branch="changed")))  # same uuid
    (d / "4.json").write_text(json.dumps(_good(4)))
    rc, _, err = _import(url, d, capsys=capsys)
    assert rc == 2 and "already stored with different content" in err
    assert "nothing stored" in err
    assert _runs(url) == 1  # 2.json (before the conflict) was rolled back too


def _spool_raw(spool_dir: Path, name: str, data: dict) -> Path:
    spool_dir.mkdir(parents=True, exist_ok=True)
    p = spool_dir / f"{name}.json"
    p.write_text(json.dumps(data))
    return p


def test_spool_sets_aside_what_cannot_be_stored_and_goes_on(url, tmp_path):
    sp = tmp_path / "spool"
    stored = make_record(specs_for(), seed=9)
    with open_db(url) as db:
        from harness.records.db.store import store_record

        store_record(db, stored)
    _spool_raw(sp, "0-long-branch", dict(_good(1), branch="b" * 300))
    _spool_raw(sp, "1-conflict", dict(stored.to_dict(), branch="other"))
    for seed in (2, 3):
        spool(make_record(specs_for(), seed=seed, minutes=seed), sp)
    with open_db(url) as db:
        ids, problems = import_spool(db, sp)
        assert len(ids) == 2 and counts(db)["runs"] == 3
    assert len(problems) == 2
    assert "branch: longer than 255 characters" in problems[0]
    assert "already stored with different content" in problems[1]
    assert spooled(sp) == []
    rejected = sorted(p.name for p in (sp / "rejected").iterdir())
    assert rejected == ["0-long-branch.json", "0-long-branch.reason", "1-conflict.json",
                        "1-conflict.reason"]
    # Set aside, not lost: the file is the one that was spooled.
    assert json.loads((sp / "rejected" / "0-long-branch.json").read_text())["branch"] == \
        "b" * 300


def test_record_refused_by_the_database_is_one_line(url, tmp_path, monkeypatch):
    """What the schema lets through but the database refuses still ends in RecordRefused
    (here: a schema widened on purpose so the column's own limit is what refuses)."""
    from harness.records import validate as v
    from harness.records.db.store import RecordRefused, store_record

    wide = json.loads(json.dumps(schema()))
    wide["properties"]["branch"]["maxLength"] = 10_000
    from jsonschema import Draft202012Validator

    monkeypatch.setattr(v, "_validator", lambda: Draft202012Validator(wide))
    rec = RunRecord.from_dict(dict(_good(5), branch="b" * 300))
    with open_db(url) as db:
        if db.dialect == "sqlite":
            pytest.skip("SQLite does not enforce VARCHAR lengths")
        with pytest.raises(RecordRefused, match="refused by the database: value too long"):
            store_record(db, rec)
        sp = tmp_path / "spool"
        spool(rec, sp)
        spool(make_record(specs_for(), seed=6, minutes=6), sp)
        ids, problems = import_spool(db, sp)
        assert len(ids) == 1 and len(problems) == 1 and "value too long" in problems[0]


def test_dev_zero_fifo_and_oversized_files_are_refused_at_once(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(65 * 2**20)  # sparse: no disk used
    for path, why in ((Path("/dev/zero"), "not a regular file"), (fifo, "not a regular file"),
                      (big, "more than the limit")):
        t0 = time.monotonic()
        done: list = []
        th = threading.Thread(target=lambda p=path, done=done: done.append(
            _import(url, p, capsys=capsys)), daemon=True)
        th.start()
        th.join(20)
        assert done, f"{path}: import hung"
        rc, _, err = done[0]
        assert rc == 2 and why in err, err
        assert time.monotonic() - t0 < 20
    # The spool reader is the same: a FIFO left in the spool does not hang an import.
    sp = tmp_path / "spool"
    sp.mkdir()
    os.mkfifo(sp / "stuck.json")
    with open_db(url) as db:
        assert import_spool(db, sp) == ([], [])  # not a regular file: not a spooled record


def test_committed_records_satisfy_the_published_schema():
    from jsonschema import Draft202012Validator

    from harness.records.validate import _validator

    Draft202012Validator.check_schema(schema())
    # validate() checks the schema with fastjsonschema's compiled form (schema_errors):
    # every committed record passes it; jsonschema's own walk (a minute for all 43 MB on
    # a loaded 2-core runner) agrees on one record of each kind of run.
    files = sorted(Path("results").glob("*.json"))
    for f in files:
        assert validate(json.loads(f.read_text())) == [], f.name
    kinds = {f.name.split("Z-", 1)[1].removesuffix(".json").rstrip("0123456789"): f
             for f in files}
    assert len(kinds) >= 6, kinds
    for f in sorted(kinds.values(), key=lambda f: f.stat().st_size)[:6]:
        assert list(_validator().iter_errors(json.loads(f.read_text()))) == [], f.name


def _leaves(x: object, path: tuple = ()) -> list[tuple]:
    if isinstance(x, dict):
        return [p for k, v in x.items() for p in _leaves(v, (*path, k))] + [path]
    if isinstance(x, list):
        return [p for i, v in enumerate(x) for p in _leaves(v, (*path, i))] + [path]
    return [path]


def test_the_compiled_schema_check_never_passes_what_jsonschema_refuses():
    """Each of 600 records with one value replaced by another type, length or sign (and the
    hostile corpus): whatever jsonschema refuses, fastjsonschema's compiled check refuses
    too, so its pass (the fast path of validate()) is jsonschema's pass."""
    import random

    from fastjsonschema import JsonSchemaException

    from harness.records.validate import _fast_check, _validator

    def fast_passes(d: object) -> bool:
        try:
            _fast_check()(d)
            return True
        except JsonSchemaException:
            return False

    base = _good()
    rng = random.Random(7)
    swaps = [True, False, None, -1, 0, 2**62, 1.5, -0.5, "", "x" * 300, "fast", [], [1],
             {}, {"a": 1}, "2026-13-45T99:00:00Z", "Z" * 70_000]
    leaves = [p for p in _leaves(base) if p]
    refused = 0
    for _ in range(600):
        d = json.loads(json.dumps(base))
        path = rng.choice(leaves)
        target = d
        for key in path[:-1]:
            target = target[key]
        if rng.random() < 0.15 and isinstance(target, dict):
            del target[path[-1]]
        else:
            target[path[-1]] = rng.choice(swaps)
        slow = list(_validator().iter_errors(d))
        refused += bool(slow)
        assert not (slow and fast_passes(d)), (path, slow[0].message[:200])
    assert refused > 300  # most of the mutations are ones the schema sees
    for name, text in HOSTILE.items():
        try:
            d = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if list(_validator().iter_errors(d)):
            assert not fast_passes(d), name


def test_schema_status_enum_is_the_status_list():
    from harness.core.results import Status

    enum = schema()["$defs"]["result"]["properties"]["status"]["enum"]
    assert enum == [s.value for s in Status]


def test_cli_spool_import_reports_waiting_and_set_aside_records(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FA_HARNESS_HOME", str(tmp_path))
    monkeypatch.delenv("FA_HARNESS_DB", raising=False)
    monkeypatch.delenv("FA_HARNESS_SPOOL", raising=False)
    sp = tmp_path / "spool"
    spool(make_record(specs_for(), seed=1), target="postgresql+psycopg://elsewhere/db")
    spool(make_record(specs_for(), seed=2, minutes=2))
    assert cli_main(["import"]) == 0  # a record waiting for its own database is no error
    out = capsys.readouterr().out
    assert "left in the spool" in out and "imported 1 spooled record(s)" in out
    _spool_raw(sp, "bad", dict(_good(3), branch="b" * 300))
    assert cli_main(["import"]) == 2
    out = capsys.readouterr().out
    assert "not imported:" in out and "set aside" in out and len(spooled(sp)) == 1
