"""Worker liveness by heartbeats: a running submission's `heartbeat_at`, renewed by its
worker with the database's clock (a job is dead only when that lease has expired by the
database's clock), and the claim's `claim_token`, which makes storing a result
idempotent (a retry after a lost commit acknowledgement finds it stored, not lost).
Rows running at upgrade time have no heartbeat: their lease runs from `claimed_at`.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("submissions", sa.Column("heartbeat_at", TS, nullable=True))
    op.add_column("submissions", sa.Column("claim_token", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("submissions") as batch:
        batch.drop_column("claim_token")
        batch.drop_column("heartbeat_at")
