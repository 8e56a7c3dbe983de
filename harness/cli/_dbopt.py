"""Shared `--db URL` option and database opening for the CLI commands."""

from __future__ import annotations

import argparse

from harness.cli.errors import UsageError

DB_HELP = ("database URL (any SQLAlchemy URL, or a SQLite file path); default: "
           "$FA_HARNESS_DB, else $FA_HARNESS_HOME/results.sqlite or "
           "~/.local/share/fa-harness/results.sqlite")


def add_db_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL", default=None, help=DB_HELP)


def open_or_fail(url: str | None, *, create: bool = True, upgrade: bool | None = None):  # noqa: ANN201
    """open_db with any database problem turned into a one-line usage error (exit 2)."""
    from harness.records.db.store import DatabaseError, open_db

    try:
        return open_db(url, create=create, upgrade=upgrade)
    except DatabaseError as exc:
        raise UsageError(str(exc)) from None
