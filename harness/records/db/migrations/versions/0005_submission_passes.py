"""A submission's backward verdict and score, its own entry (`submission_passes`, pass
"bwd") beside the forward's `submissions` row, so that each pass is ranked on its own
board. Existing submissions have no such entry: they are forward-only, as they were
scored.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Spelled out here (not imported from models) so this revision stays what it was when the
# models move on.
JSONT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "submission_passes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("submission_id", sa.Integer(),
                  sa.ForeignKey("submissions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("pass_name", sa.String(8), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("score", sa.Double(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("failing_cases", JSONT, nullable=True),
        sa.Column("detail", JSONT, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.UniqueConstraint("submission_id", "pass_name", name="uq_submission_passes_pass"),
    )
    op.create_index("ix_submission_passes_board", "submission_passes",
                    ["pass_name", "verdict"])


def downgrade() -> None:
    op.drop_table("submission_passes")
