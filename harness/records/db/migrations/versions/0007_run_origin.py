"""Where a stored run came from (`runs.origin`) and whether baselines may use it
(`runs.trusted`).

A record says what it is (`source`: ci, cli, import, ...), but anyone can write a record:
what makes a run part of the project's history is the path it was stored by. The harness's
own runs (`ci`, `run`, the spool they fall back to) are trusted; `fa-harness import` stores
untrusted runs unless the operator passes `--trusted`. Baselines, the noise history and the
step search read trusted runs only (harness.records.db.queries, harness.records.noise).

Runs stored before this revision were stored by the operator's own tools: they stay
trusted (`server_default` true), with no origin recorded (NULL).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("origin", sa.String(255), nullable=True))
        batch.add_column(sa.Column("trusted", sa.Boolean(), nullable=False,
                                   server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("trusted")
        batch.drop_column("origin")
