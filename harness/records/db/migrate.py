"""Alembic migrations run from code: `upgrade(engine)` and revision queries.

Several processes may open a new database at the same moment (parallel CI workers), so the
upgrade runs inside one transaction that first takes a lock: PostgreSQL an advisory
transaction lock, SQLite the write lock (BEGIN IMMEDIATE, see harness.records.db.engine). The
second process then finds the schema already at head and does nothing.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

DB_DIR = Path(__file__).resolve().parent
ALEMBIC_INI = DB_DIR / "alembic.ini"
# Arbitrary constant naming the advisory lock that serialises schema upgrades.
_PG_MIGRATION_LOCK = 0x6661_6861_726E  # "fahar n"


def alembic_config() -> Config:
    cfg = Config(str(ALEMBIC_INI))
    cfg.set_main_option("script_location", str(DB_DIR / "migrations"))
    return cfg


@cache
def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations have {len(heads)} heads, expected one: {heads}")
    return heads[0]


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Upgrade the database to `revision`; returns (revision before, revision after)."""
    cfg = alembic_config()
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        before = current_revision(conn)
        target = head_revision() if revision == "head" else revision
        if before != target:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
        after = current_revision(conn)
    return before, after


def downgrade(engine: Engine, revision: str) -> None:
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
