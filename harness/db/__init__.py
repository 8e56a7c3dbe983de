"""The results database: models, engines/sessions, Alembic migrations and the store API.

`from harness.db import open_db` opens (and, for a new database, creates) the database;
`harness.db.models` holds the schema; `harness.db.engine.read_session` gives the dashboard
a read-only session.
"""

from harness.db.engine import default_db_path, make_engine, read_session, resolve_url, spool_dir
from harness.db.store import Database, DatabaseError, open_db, store_record

__all__ = [
    "Database", "DatabaseError", "default_db_path", "make_engine", "open_db", "read_session",
    "resolve_url", "spool_dir", "store_record",
]
