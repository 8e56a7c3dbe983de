"""Opening the results database: `open_db` (creating and migrating a new one), the `Database`
handle, and the errors every caller of the store sees.

A damaged database (a SQLite file with garbage over some of its pages, a file that is not
a database at all, PostgreSQL's data-corruption errors) is `DatabaseDamaged`, wherever a
statement meets the damage: one line naming the database and what the driver found,
never a driver traceback. Damage where no statement reads goes unseen until a check
reads every page (`integrity_problems`, which `fa-harness db current` runs).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, event, inspect, text
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from harness.records.db import migrate
from harness.records.db.engine import (
    display_url,
    make_engine,
    resolve_url,
    session_factory,
    sqlite_file,
)


class DatabaseError(Exception):
    """The database cannot be used: unreachable, wrong schema, conflicting data."""


class DatabaseUnavailable(DatabaseError):
    """Cannot connect at all (the caller spools the record instead)."""


class DatabaseDamaged(DatabaseUnavailable):
    """The database's file (or server's data) is damaged: nothing can be relied on in it.
    A kind of DatabaseUnavailable: a run is kept in the spool rather than set aside."""


class RecordConflict(DatabaseError):
    """A record with this uuid is already stored with different content."""


@dataclass
class Database:
    url: str
    engine: Engine
    sessions: sessionmaker[Session]
    readonly: bool = False
    # The session of the open `transaction()` of each thread that has one.
    _joined: dict[int, Session] = field(default_factory=dict, init=False, repr=False,
                                        compare=False)

    @property
    def display_url(self) -> str:
        return display_url(self.url)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on error. Inside
        a `transaction()` of the same thread, that transaction's session (committed when it
        ends)."""
        joined = self._joined.get(threading.get_ident())
        if joined is not None:
            yield joined
            return
        with self.sessions() as s, s.begin():
            yield s

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One transaction for everything this thread does with the database inside the
        block: every `session()` opened there joins it, so all of it is committed at the
        end or none of it (an error, Ctrl-C). Nested, it joins the outer one."""
        me = threading.get_ident()
        if me in self._joined:
            yield self._joined[me]
            return
        with self.sessions() as s, s.begin():
            self._joined[me] = s
            try:
                yield s
            finally:
                del self._joined[me]

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_db(url: str | None = None, *, create: bool = True, readonly: bool = False,
            upgrade: bool | None = None) -> Database:
    """Open the database at `url` (see harness.records.db.engine.resolve_url).

    create: a missing SQLite file (and its directory) is created, and an empty database
    gets the schema. A database behind the current migrations is upgraded when it is a
    SQLite file (`upgrade=None`, the default) - a shared server database is upgraded only
    on request (`fa-harness db upgrade`, or upgrade=True), since other runners use it.
    Raises DatabaseUnavailable when no connection can be made, DatabaseError otherwise."""
    url = resolve_url(url)
    shown = display_url(url)
    path = sqlite_file(url)
    if path is not None and not path.exists():
        if not create or readonly:
            raise DatabaseError(f"no database at {path} (run `fa-harness db upgrade`)")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseUnavailable(f"cannot create {path.parent}: {exc}") from None
    try:
        engine = make_engine(url, readonly=readonly)
        _report_damage(engine, shown)
    except ImportError as exc:  # the base install has no PostgreSQL driver
        raise DatabaseError(f"database URL {shown} needs a driver that is not installed "
                            f"({exc.name or exc}); for PostgreSQL: "
                            f"pip install 'fa-harness[postgres]'") from None
    except (SQLAlchemyError, ValueError) as exc:
        raise DatabaseError(f"bad database URL {shown}: {exc}") from None
    try:
        with engine.connect() as conn:
            current = migrate.current_revision(conn)
    except DatabaseDamaged:
        engine.dispose()
        raise
    except (OperationalError, DBAPIError) as exc:
        engine.dispose()
        reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        raise DatabaseUnavailable(f"cannot connect to {shown}: {reason}") from None
    head = migrate.head_revision()
    if current != head:
        auto = upgrade if upgrade is not None else (current is None or path is not None)
        if readonly or not create or not auto:
            engine.dispose()
            have = current or "empty"
            raise DatabaseError(f"database {shown} is at schema revision {have}, this "
                                f"fa-harness needs {head}: run `fa-harness db upgrade --db URL`")
        try:
            migrate.upgrade(engine)
        except SQLAlchemyError as exc:
            engine.dispose()
            raise DatabaseError(f"upgrading {shown} failed: {exc}") from None
    return Database(url=url, engine=engine, sessions=session_factory(engine), readonly=readonly)


# SQLite's result codes for a damaged file and for a file that is not a database.
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26


def damage_of(exc: BaseException) -> str | None:
    """What a driver error says is damaged (its first line), or None when the error is
    not about damage. SQLite: SQLITE_CORRUPT / SQLITE_NOTADB; PostgreSQL: SQLSTATE
    class XX001/XX002 (data or index corrupted)."""
    code = getattr(exc, "sqlite_errorcode", None)
    state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if (isinstance(code, int) and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)) or \
            state in ("XX001", "XX002"):
        return " ".join(str(exc).split())[:200] or type(exc).__name__
    return None


def _report_damage(engine: Engine, shown: str) -> None:
    """Turn a driver error about damage, wherever a statement meets it, into one
    DatabaseDamaged line (the module doc)."""

    @event.listens_for(engine, "handle_error")
    def _on_error(context: Any) -> None:
        what = damage_of(context.original_exception)
        if what is not None:
            raise DatabaseDamaged(f"database {shown} is damaged: {what}")


def integrity_problems(db: Database, limit: int = 5) -> list[str]:
    """What a full read of the database finds wrong (empty: nothing). SQLite: `PRAGMA
    quick_check` (every page and record read, indexes not matched to their tables); any
    dialect: the tables of the schema exist."""
    from harness.records.db.models import Base

    problems: list[str] = []
    with db.engine.connect() as conn:
        if db.dialect == "sqlite":
            rows = [str(r[0]) for r in conn.execute(text(f"PRAGMA quick_check({limit})"))]
            problems += [" ".join(r.split()) for r in rows if r != "ok"]
        have = set(inspect(conn).get_table_names())
    missing = sorted(set(Base.metadata.tables) - have)
    if missing:
        problems.append(f"tables missing: {', '.join(missing)}")
    return problems
