"""Where the results database lives, and how engines and sessions are made.

Default: a SQLite file at `$FA_HARNESS_HOME/results.sqlite`, or
`~/.local/share/fa-harness/results.sqlite` when FA_HARNESS_HOME is unset. Any SQLAlchemy
URL can be given instead (`--db URL` on the command line, or FA_HARNESS_DB); a bare file
path means a SQLite file there.

SQLite is tuned for several writer processes on one runner: WAL (readers never block the
writer), a busy timeout (a writer waits for the lock instead of failing), and every write
transaction starts with BEGIN IMMEDIATE, so two writers never both read and then both try
to upgrade to a write lock (which SQLite answers with an immediate "database is locked").
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from harness.records.paths import home_dir, spool_dir  # noqa: F401 - spool_dir re-exported

DB_FILENAME = "results.sqlite"
SQLITE_BUSY_TIMEOUT_MS = 60_000


def default_db_path() -> Path:
    return home_dir() / DB_FILENAME


def resolve_url(url: str | None = None) -> str:
    """The URL to open: the argument, else FA_HARNESS_DB, else the default SQLite file.
    A string without '://' is taken as a SQLite file path."""
    url = url or os.environ.get("FA_HARNESS_DB") or str(default_db_path())
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    return url


def target_of(url: str | None) -> str:
    """How a spooled record names the database it is meant for (what Database.display_url
    of that database says): resolved as open_db resolves it, password masked."""
    return display_url(resolve_url(url))


def display_url(url: str) -> str:
    """The URL with any password masked, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a malformed URL is shown as given (it has no secret to hide)
        return url


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def sqlite_file(url: str) -> Path | None:
    """The file behind a SQLite URL (None for in-memory databases)."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    if u.database.startswith("file:"):
        return None
    return Path(u.database)


def _set_wal(cur: Any) -> None:
    """Switch a SQLite file to WAL. The switch needs the file to itself for a moment and
    SQLite answers "database is locked" at once, without the busy timeout, when another
    process holds it (several runners opening one new file together): retry for as long
    as the busy timeout would have waited."""
    import sqlite3
    import time

    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _install_sqlite_listeners(engine: Engine, *, readonly: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin (see module doc).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            if not readonly:
                _set_wal(cur)
                cur.execute("PRAGMA synchronous = NORMAL")
            cur.execute("PRAGMA foreign_keys = ON")
            if readonly:
                cur.execute("PRAGMA query_only = ON")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")


def make_engine(url: str | None = None, *, readonly: bool = False, echo: bool = False) -> Engine:
    """An engine for `url` (resolved as in `resolve_url`). `readonly` engines refuse writes
    (SQLite: query_only; PostgreSQL: read-only transactions); the dashboard uses them."""
    url = resolve_url(url)
    kwargs: dict[str, Any] = {"echo": echo, "future": True}
    if is_sqlite(url):
        kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
                                  "check_same_thread": False}
        engine = create_engine(url, **kwargs)
        _install_sqlite_listeners(engine, readonly=readonly)
        return engine
    kwargs["pool_pre_ping"] = True
    if make_url(url).get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": 10}
        if readonly:
            # Appended to any options of the URL itself (e.g. a search_path).
            opts = make_url(url).query.get("options") or ""
            if isinstance(opts, tuple):
                opts = " ".join(opts)
            kwargs["connect_args"]["options"] = (
                f"{opts} -c default_transaction_read_only=on".strip())
    return create_engine(url, **kwargs)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: objects returned from a finished session stay readable.
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def read_session(url: str | None = None) -> Iterator[Session]:
    """A read-only session on the database at `url` (for the dashboard and reports)."""
    engine = make_engine(url, readonly=True)
    try:
        with session_factory(engine)() as session:
            yield session
    finally:
        engine.dispose()
