"""Opening the results database: `open_db` (creating and migrating a new one), the `Database`
handle, and the errors every caller of the store sees.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import Engine
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


class RecordConflict(DatabaseError):
    """A record with this uuid is already stored with different content."""


@dataclass
class Database:
    url: str
    engine: Engine
    sessions: sessionmaker[Session]
    readonly: bool = False

    @property
    def display_url(self) -> str:
        return display_url(self.url)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on error."""
        with self.sessions() as s, s.begin():
            yield s

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
    except ImportError as exc:  # the base install has no PostgreSQL driver
        raise DatabaseError(f"database URL {shown} needs a driver that is not installed "
                            f"({exc.name or exc}); for PostgreSQL: "
                            f"pip install 'fa-harness[postgres]'") from None
    except (SQLAlchemyError, ValueError) as exc:
        raise DatabaseError(f"bad database URL {shown}: {exc}") from None
    try:
        with engine.connect() as conn:
            current = migrate.current_revision(conn)
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
