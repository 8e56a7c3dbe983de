"""`fa-harness db upgrade|current [--db URL]`: schema migrations of the results database.

`db current` also checks the database: SQLite's `PRAGMA quick_check` reads every page
and record (damage where no query happens to read is found here first), and on any
database the schema's tables must exist. A problem is one line and exit code 2."""

from __future__ import annotations

import argparse

from harness.cli._dbopt import add_db_option
from harness.cli.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("db", help="results database: create/upgrade the schema")
    dsub = p.add_subparsers(dest="db_command", metavar="ACTION")
    dsub.required = True
    up = dsub.add_parser("upgrade", help="create the database or bring its schema to head")
    add_db_option(up)
    up.set_defaults(func=cmd_upgrade)
    cur = dsub.add_parser("current", help="show the database URL, revision and row counts")
    add_db_option(cur)
    cur.set_defaults(func=cmd_current)


def cmd_upgrade(args: argparse.Namespace) -> int:
    from harness.records.db import migrate
    from harness.records.db.engine import display_url, make_engine, resolve_url, sqlite_file
    from harness.records.db.store import DatabaseError, open_db

    url = resolve_url(args.db)
    path = sqlite_file(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        engine = make_engine(url)
        try:
            before, after = migrate.upgrade(engine)
        finally:
            engine.dispose()
        db = open_db(url, create=False)  # proves the result is usable
        db.close()
    except DatabaseError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - driver errors: one line, exit 2
        reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        raise UsageError(f"cannot upgrade {display_url(url)}: {reason}") from None
    if before == after:
        print(f"{display_url(url)}: schema already at {after}")
    else:
        print(f"{display_url(url)}: schema {before or 'empty'} -> {after}")
    return 0


def cmd_current(args: argparse.Namespace) -> int:
    from harness.cli._dbopt import open_or_fail
    from harness.records.db import migrate
    from harness.records.db.database import integrity_problems
    from harness.records.db.store import counts

    db = open_or_fail(args.db, create=False, upgrade=False)
    try:
        problems = integrity_problems(db)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise UsageError(f"database {db.display_url} is damaged: {problems[0]}{more}")
        with db.engine.connect() as conn:
            rev = migrate.current_revision(conn)
        print(f"{db.display_url}: revision {rev} (head {migrate.head_revision()})")
        for table, n in counts(db).items():
            print(f"  {table}: {n}")
    finally:
        db.close()
    return 0
