"""The results database: models, engines/sessions, Alembic migrations and the store API.

`from harness.records.db import open_db` opens (and, for a new database, creates) the database;
`harness.records.db.models` holds the schema; `harness.records.db.engine.read_session` gives the dashboard
a read-only session.

The public names are resolved on first use (PEP 562): the record store imports the case
layer and with it torch, which `import harness.records.db.models` or `harness.records.db.engine` (SQLAlchemy
only; what the dashboard uses) must not pay for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.records.db.engine import (
        default_db_path,
        make_engine,
        read_session,
        resolve_url,
        spool_dir,
    )
    from harness.records.db.store import Database, DatabaseError, open_db, store_record

_HOME = {
    "default_db_path": "engine", "make_engine": "engine", "read_session": "engine",
    "resolve_url": "engine", "spool_dir": "engine",
    "Database": "store", "DatabaseError": "store", "open_db": "store", "store_record": "store",
}

__all__ = [
    "Database", "DatabaseError", "default_db_path", "make_engine", "open_db", "read_session",
    "resolve_url", "spool_dir", "store_record",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
