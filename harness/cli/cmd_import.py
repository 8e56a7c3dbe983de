"""`fa-harness import [FILE_OR_DIR ...]`: store run records (or pytest-benchmark JSON files)
in the database; with no argument, the records waiting in the spool.

Every file is read and validated before anything is stored: one bad file means exit 2 and
nothing stored. Importing a record that is already stored does nothing (same uuid)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.cli import UsageError
from harness.cli._dbopt import add_db_option, open_or_fail


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="store run records / pytest-benchmark JSON files")
    p.add_argument("paths", nargs="*", metavar="FILE_OR_DIR",
                   help="record files, pytest-benchmark --benchmark-json files, or "
                        "directories of them (*.json); none: the spool directory")
    add_db_option(p)
    p.set_defaults(func=cmd_import)


def load_any(path: Path):  # noqa: ANN201 - RunRecord
    """A run record from a record file or a pytest-benchmark JSON file."""
    from harness.benchimport import looks_like_benchmark_json, record_from_benchmark_json
    from harness.record import RecordError, RunRecord

    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except FileNotFoundError:
        raise RecordError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"{path}: cannot read JSON ({exc})") from None
    try:
        if looks_like_benchmark_json(data):
            return record_from_benchmark_json(data, text=text)
        return RunRecord.from_dict(data)
    except RecordError as exc:
        raise RecordError(f"{path}: {exc}") from None


def expand(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.rglob("*.json"))
            if not found:
                raise UsageError(f"{p}: no *.json files")
            files += found
        elif p.exists():
            files.append(p)
        else:
            raise UsageError(f"{p}: no such file or directory")
    return files


def cmd_import(args: argparse.Namespace) -> int:
    from harness.db.store import DatabaseError, import_spool, store_record
    from harness.record import RecordError

    if not args.paths:
        db = open_or_fail(args.db)
        try:
            ids, problems = import_spool(db)
        finally:
            db.close()
        for p in problems:
            print(f"kept in spool: {p}")
        print(f"imported {len(ids)} spooled record(s)")
        return 2 if problems else 0
    files = expand(args.paths)
    try:
        records = [(f, load_any(f)) for f in files]
    except RecordError as exc:
        raise UsageError(str(exc)) from None
    db = open_or_fail(args.db)
    new = 0
    try:
        from sqlalchemy import select

        from harness.db.models import Run

        for f, rec in records:
            with db.session() as s:
                known = s.execute(select(Run.id).where(Run.uuid == rec.uuid)).scalar()
            run_id = store_record(db, rec)
            new += known is None
            print(f"{f}: run {run_id}" + (" (already stored)" if known is not None else ""))
    except DatabaseError as exc:
        raise UsageError(str(exc)) from None
    finally:
        db.close()
    print(f"{new} new run(s), {len(records) - new} already stored")
    return 0
