"""An index on (pass, variant) of results: the dashboard lists which variants have a
backward from it, without reading a million forward results.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_results_pass_variant", "results", ["pass_name", "variant_id"])


def downgrade() -> None:
    op.drop_index("ix_results_pass_variant", table_name="results")
