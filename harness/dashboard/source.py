"""Which database the dashboard reads, and whether it can read it.

Resolution order: an explicit URL (`fa-harness dashboard --db URL`, or `streamlit run
dashboard/app.py -- --db URL`), then the `FA_HARNESS_DB` environment variable, then the
project's default SQLite database (`harness.records.db.engine.resolve_url` decides all three).

`probe()` turns every way a database can be unusable (unreachable server, missing SQLite
file, no schema, no runs yet) into one state plus one readable sentence, so that pages show
a message instead of a traceback.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import Engine, func, inspect, select
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from harness.dashboard.schema import engine as engine_mod

IMPORT_HINT = "fa-harness import --trusted results/"


def url_from_argv(argv: list[str]) -> str | None:
    """`--db URL` from the script arguments (what follows `--` in `streamlit run`)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--db", default=None)
    known, _ = parser.parse_known_args(argv)
    return known.db


def resolve_url(explicit: str | None = None) -> str:
    """--db, else FA_HARNESS_DB, else the default SQLite file (harness.records.db decides)."""
    return engine_mod.resolve_url(explicit)


def redact(url: str) -> str:
    """The URL with its password hidden, safe to print on a page."""
    return engine_mod.display_url(url)


class DbState(StrEnum):
    OK = "ok"
    BAD_URL = "bad_url"  # not a URL SQLAlchemy understands, or its driver is missing
    MISSING = "missing"  # a SQLite file that does not exist
    UNREACHABLE = "unreachable"  # the server refused, timed out, or the file is unreadable
    NO_SCHEMA = "no_schema"  # reachable, but the harness tables are not there
    EMPTY = "empty"  # schema present, no runs recorded yet


@dataclass(frozen=True)
class Probe:
    state: DbState
    message: str
    runs: int = 0

    @property
    def ok(self) -> bool:
        return self.state is DbState.OK


def make_engine(url: str) -> Engine:
    """A read-only engine: the dashboard never writes (SQLite query_only, PostgreSQL
    read-only transactions)."""
    return engine_mod.make_engine(url, readonly=True)


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def probe(url: str, engine: Engine | None = None) -> Probe:
    shown = redact(url)
    try:
        path = engine_mod.sqlite_file(url)
    except ArgumentError as e:
        return Probe(DbState.BAD_URL, f"`{url}` is not a database URL ({e}).")
    if path is not None and not path.exists():
        return Probe(
            DbState.MISSING,
            f"The SQLite database `{path}` does not exist yet. Create it and load this "
            f"project's own H200 history with one command: `{IMPORT_HINT}`.",
        )
    try:
        eng = engine or make_engine(url)
    except (ArgumentError, NoSuchModuleError, ImportError) as e:
        return Probe(DbState.BAD_URL, f"Cannot use the database URL `{shown}`: {_short(e)}")
    try:
        from harness.dashboard.schema import Run

        with eng.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            needed = {"runs", "results", "variants", "cases"}
            if not needed <= tables:
                missing = ", ".join(sorted(needed - tables))
                return Probe(
                    DbState.NO_SCHEMA,
                    f"The database `{shown}` has no fa-harness tables ({missing} missing). "
                    f"Load this project's own H200 history with one command: `{IMPORT_HINT}`.",
                )
            runs = int(conn.execute(select(func.count()).select_from(Run)).scalar_one())
    except SQLAlchemyError as e:
        return Probe(DbState.UNREACHABLE, f"Cannot read the database `{shown}`: {_short(e)}")
    finally:
        if engine is None:
            eng.dispose()
    if runs == 0:
        return Probe(
            DbState.EMPTY,
            f"The database `{shown}` has no runs yet. Load this project's own H200 history "
            f"with one command: `{IMPORT_HINT}` (or record a run with the pytest suites).",
        )
    return Probe(DbState.OK, f"{runs} runs in `{shown}`", runs)
