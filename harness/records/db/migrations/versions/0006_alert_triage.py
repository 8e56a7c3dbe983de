"""Alerts with a life (`alerts`): one row per step of a (GPU model, variant, pass), from
the commit it began at, with its triage state (open, acknowledged, accepted, recovered,
withdrawn), who set it and why, and the culprit a bisection found. The per-case verdicts
in `comparisons` stay what flags; an alert is what a person acts on.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Spelled out here (not imported from models) so this revision stays what it was when the
# models move on.
JSONT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("gpu_model_key", sa.String(128), nullable=False),
        sa.Column("variant", sa.String(255), nullable=False),
        sa.Column("pass_name", sa.String(8), nullable=False, server_default="fwd"),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("verdict", sa.String(32), nullable=False),
        sa.Column("owned", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("state", sa.String(16), nullable=False, server_default="open"),
        sa.Column("first_bad_commit", sa.String(64), nullable=True),
        sa.Column("last_good_commit", sa.String(64), nullable=True),
        sa.Column("first_run_id", sa.Integer(),
                  sa.ForeignKey("runs.id", ondelete="SET NULL"), nullable=True),
        sa.Column("last_run_id", sa.Integer(),
                  sa.ForeignKey("runs.id", ondelete="SET NULL"), nullable=True),
        sa.Column("confirmations", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("cases", JSONT, nullable=True),
        sa.Column("worst_ratio", sa.Double(), nullable=True),
        sa.Column("worst_case", sa.String(128), nullable=True),
        sa.Column("who", sa.String(255), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("link", sa.Text(), nullable=True),
        sa.Column("culprit_commit", sa.String(64), nullable=True),
        sa.Column("detail", JSONT, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    # The gate's summary and the Overview: the open alerts of one GPU model.
    op.create_index("ix_alerts_state_gpu", "alerts", ["state", "gpu_model_key"])
    # sync_alerts: the live alert of one (GPU model, variant, pass).
    op.create_index("ix_alerts_series", "alerts", ["gpu_model_key", "variant", "pass_name"])


def downgrade() -> None:
    op.drop_table("alerts")
