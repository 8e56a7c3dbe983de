"""The pass (forward / backward) on results and comparisons: a candidate's backward is its
own entry, never folded into its forward's.

Existing rows are forward results (`server_default` "fwd"). The unique key of a result
becomes (run, variant, case, pass).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("pass_name", sa.String(8), nullable=False,
                                   server_default="fwd"))
        batch.drop_constraint("uq_results_run_variant_case", type_="unique")
        batch.create_unique_constraint("uq_results_run_variant_case_pass",
                                       ["run_id", "variant_id", "case_pk", "pass_name"])
    with op.batch_alter_table("comparisons") as batch:
        batch.add_column(sa.Column("pass_name", sa.String(8), nullable=False,
                                   server_default="fwd"))


def downgrade() -> None:
    # Backward rows have no place in the old schema: they go first.
    op.execute("DELETE FROM comparisons WHERE pass_name <> 'fwd'")
    op.execute("DELETE FROM results WHERE pass_name <> 'fwd'")
    with op.batch_alter_table("comparisons") as batch:
        batch.drop_column("pass_name")
    with op.batch_alter_table("results") as batch:
        batch.drop_constraint("uq_results_run_variant_case_pass", type_="unique")
        batch.create_unique_constraint("uq_results_run_variant_case",
                                       ["run_id", "variant_id", "case_pk"])
        batch.drop_column("pass_name")
