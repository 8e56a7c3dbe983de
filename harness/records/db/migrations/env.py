"""Alembic environment of the results database.

Called two ways: from `harness.records.db.migrate.upgrade`, which hands over an open connection
(already inside a locked transaction) through `config.attributes["connection"]`, or from
the plain `alembic` command line, which gets an engine for FA_HARNESS_DB / the default
database. SQLite needs batch mode for ALTER TABLE, so it is always on.
"""

from __future__ import annotations

from alembic import context

from harness.records.db.engine import make_engine, resolve_url
from harness.records.db.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection) -> None:  # noqa: ANN001 - alembic hands over a Connection
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
    )


def run_offline() -> None:
    context.configure(url=resolve_url(None), target_metadata=target_metadata,
                      literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(None)
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
