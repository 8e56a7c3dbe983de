"""`fa-harness export --run ID|UUID|latest -o FILE`: a stored run as a JSON run record."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli._dbopt import add_db_option, open_or_fail
from harness.cli.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a stored run as a JSON run record")
    p.add_argument("--run", required=True, metavar="ID|UUID|latest")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="record file to write ('-' for stdout)")
    add_db_option(p)
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from harness.records.db.store import DatabaseError, load_record

    db = open_or_fail(args.db, create=False)
    try:
        record = load_record(db, args.run)
    except DatabaseError as exc:
        raise UsageError(str(exc)) from None
    finally:
        db.close()
    if args.output == "-":
        print(record.dumps(), end="")
    else:
        try:
            path = record.write(Path(args.output))
        except OSError as exc:
            raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
        print(f"run {args.run} ({record.uuid}, {len(record.results)} results) -> {path}")
    return 0
