"""`fa-harness import [FILE_OR_DIR ...]`: store run records (or pytest-benchmark JSON files)
in the database; with no argument, the records waiting in the spool.

Every file is read and validated before anything is stored, and all are stored in one
transaction together with their verdicts (each new run compared with its baseline): one
bad file, or one record the database refuses (a conflict), means exit 2 and nothing
stored, and an import stopped halfway (Ctrl-C) stores nothing either, so a run is never
stored without its verdicts. From the spool (no argument) each record is stored with its
verdicts in a transaction of its own, oldest first. Importing a record that is already
stored does nothing (same uuid).
Only regular files are read, each of bounded size (harness.records.jsonio).
In a directory, files that are not records (a README, logs, archives, JSON of another
kind) are skipped with a note; a file named on the command line must be a record.

Anyone can write a well-formed record, so an imported run is stored untrusted: marked
with its origin (`import by user@host`), shown, but never a baseline, never in the noise
history or the step search, and not judged. `--trusted` is the operator's word that the
files are the project's own history (the committed records under results/: `fa-harness
import --trusted results/`); their runs are then judged and used like a CI run's. The
spool (no argument) holds this machine's own runs and is trusted."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli._dbopt import add_db_option, open_or_fail
from harness.cli.console import plain
from harness.cli.errors import UsageError

if TYPE_CHECKING:
    from harness.records.baseline import Judged
    from harness.records.record import RunRecord


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="store run records / pytest-benchmark JSON files")
    p.add_argument("paths", nargs="*", metavar="FILE_OR_DIR",
                   help="record files, pytest-benchmark --benchmark-json files, or "
                        "directories of them (other files there are skipped with a "
                        "note); none: the spool directory")
    p.add_argument("--trusted", action="store_true",
                   help="the files are the project's own history (e.g. results/): their "
                        "runs may be baselines; without it imported runs are stored "
                        "untrusted, never a baseline")
    add_db_option(p)
    p.set_defaults(func=cmd_import)


def _read_json(path: Path) -> tuple[str, object]:
    from harness.records.jsonio import JsonInputError, read_json
    from harness.records.record import RecordError

    try:
        return read_json(path)
    except JsonInputError as exc:
        raise RecordError(str(exc)) from None


def _parse(path: Path, text: str, data: object) -> RunRecord:
    from harness.records.benchimport import looks_like_benchmark_json, record_from_benchmark_json
    from harness.records.record import RecordError, RunRecord

    try:
        if looks_like_benchmark_json(data):
            return record_from_benchmark_json(data, text=text)
        return RunRecord.from_dict(data)
    except RecordError as exc:
        raise RecordError(f"{path}: {exc}") from None


def load_any(path: Path) -> RunRecord:
    """A run record from a record file or a pytest-benchmark JSON file."""
    return _parse(path, *_read_json(path))


def _claims_to_be_a_record(data: object) -> bool:
    """A run record (valid or not) or a pytest-benchmark file: anything else found in a
    directory (another tool's JSON) is not ours to import."""
    from harness.records.benchimport import looks_like_benchmark_json

    return looks_like_benchmark_json(data) or (
        isinstance(data, dict) and "schema_version" in data)


def expand(paths: list[str]) -> tuple[list[tuple[Path, bool]], list[str]]:
    """(file, named on the command line) pairs to read, and notes on files of directories
    that are skipped because they cannot be records (not *.json)."""
    files: list[tuple[Path, bool]] = []
    notes: list[str] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file())
            for f in found:
                if f.suffix == ".json":
                    files.append((f, False))
                else:
                    notes.append(f"{f}: skipped (not a run record)")
        elif p.exists():
            files.append((p, True))
        else:
            raise UsageError(f"{p}: no such file or directory")
    return files, notes


def load_all(paths: list[str]) -> tuple[list[tuple[Path, RunRecord]], list[str]]:
    """Every record to store, and the notes on skipped files. A record file that does not
    read or validate raises RecordError; a directory without any record is a usage error."""
    files, notes = expand(paths)
    records: list[tuple[Path, RunRecord]] = []
    for f, named in files:
        text, data = _read_json(f)
        if not named and not _claims_to_be_a_record(data):
            notes.append(f"{f}: skipped (JSON, but not a run record or pytest-benchmark file)")
            continue
        records.append((f, _parse(f, text, data)))
    if not records:
        raise UsageError(f"no run records in {', '.join(paths)}"
                         + (f" ({len(notes)} other file(s) skipped)" if notes else ""))
    return records, notes


def _import_spool(url: str | None) -> int:
    from harness.records.baseline import judge_runs
    from harness.records.db.store import DatabaseError, import_spool

    db = open_or_fail(url)
    waiting: list[str] = []
    judged: list[Judged] = []
    try:
        # Each record is stored and judged in one transaction (import_spool's `judge`).
        ids, problems = import_spool(
            db, waiting=waiting, judge=lambda d, run_id: judged.extend(judge_runs(d, [run_id])))
    except DatabaseError as exc:
        raise UsageError(str(exc)) from None
    finally:
        db.close()
    _print_judged(judged)
    for p in waiting:
        print(f"left in the spool: {plain(p)}")
    for p in problems:
        print(f"not imported: {plain(p)}")
    print(f"imported {len(ids)} spooled record(s)")
    return 2 if problems else 0


def _print_judged(judged: list[Judged]) -> None:
    """One line per newly stored run: its verdicts against its baseline (what `ci` does)."""
    for j in judged:
        flagged = {k: n for k, n in j.counts.items() if k not in ("same", "new")}
        if j.baseline == "untrusted":
            print(f"run {j.run_id}: {plain(j.note)}")
            continue
        if j.base_run_id is None:
            continue
        what = ", ".join(f"{k} {n}" for k, n in flagged.items()) or "no change"
        print(f"run {j.run_id} vs run {j.base_run_id} ({plain(j.baseline)}): "
              + plain(j.note or what))


def cmd_import(args: argparse.Namespace) -> int:
    from harness.records.baseline import judge_runs
    from harness.records.db.store import DatabaseError, Origin, store_records, who
    from harness.records.record import RecordError

    if not args.paths:
        return _import_spool(args.db)
    try:
        records, notes = load_all(args.paths)
    except RecordError as exc:
        raise UsageError(str(exc)) from None
    for note in notes:
        print(plain(note))
    # Who vouches for these runs: the operator with --trusted, else nobody (module doc).
    origin = Origin("import (trusted)" if args.trusted else "import", who(),
                    trusted=args.trusted)
    db = open_or_fail(args.db)
    try:
        # The runs and their verdicts in one transaction (module doc).
        with db.transaction():
            stored = store_records(db, [rec for _, rec in records], origin)
            judged = judge_runs(db, [run_id for run_id, _ in stored])
    except DatabaseError as exc:
        raise UsageError(f"{exc}; nothing stored") from None
    finally:
        db.close()
    _print_judged(judged)
    for (f, _), (run_id, new) in zip(records, stored, strict=True):
        print(f"{plain(f)}: run {run_id}" + ("" if new else " (already stored)"))
    new = sum(n for _, n in stored)
    print(f"{new} new run(s), {len(records) - new} already stored"
          + ("" if args.trusted else " (untrusted: not baselines; --trusted for the "
                                     "project's own records)"))
    return 0
