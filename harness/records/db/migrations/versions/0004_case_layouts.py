"""The serving case kinds: a case's sliding window, memory layout (dense, varlen,
paged), page size and full-lengths flag. Existing cases are dense, windowless.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("window_left", sa.Integer(), "-1"),
    ("window_right", sa.Integer(), "-1"),
    ("layout", sa.String(8), "dense"),
    ("page_size", sa.Integer(), "0"),
    ("full_lengths", sa.Boolean(), sa.false()),
)


def upgrade() -> None:
    # batch_alter_table: SQLite cannot add NOT NULL columns in place on every version.
    with op.batch_alter_table("cases") as batch:
        for name, type_, default in _COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=False, server_default=default))


def downgrade() -> None:
    with op.batch_alter_table("cases") as batch:
        for name, _, _ in reversed(_COLUMNS):
            batch.drop_column(name)
