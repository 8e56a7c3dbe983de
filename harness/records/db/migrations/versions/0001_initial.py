"""Initial schema: runs, variants, cases, results, comparisons, submissions, api_tokens.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Spelled out here (not imported from models) so this revision stays what it was when the
# models move on.
JSONT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("uuid", sa.String(36), nullable=False),
        sa.Column("commit", sa.String(64), nullable=True),
        sa.Column("parent_commit", sa.String(64), nullable=True),
        sa.Column("branch", sa.String(255), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("gpu_name", sa.String(255), nullable=True),
        sa.Column("gpu_uuid", sa.String(64), nullable=True),
        sa.Column("gpu_model_key", sa.String(128), nullable=True),
        sa.Column("driver", sa.String(64), nullable=True),
        sa.Column("cuda", sa.String(64), nullable=True),
        sa.Column("torch", sa.String(64), nullable=True),
        sa.Column("cupy", sa.String(64), nullable=True),
        sa.Column("python", sa.String(64), nullable=True),
        sa.Column("hostname", sa.String(255), nullable=True),
        sa.Column("clocks", JSONT, nullable=True),
        sa.Column("calibration", JSONT, nullable=True),
        sa.Column("grids", JSONT, nullable=True),
        sa.Column("schema_version", sa.Integer(), nullable=False),
        sa.Column("record_sha256", sa.String(64), nullable=True),
        sa.Column("env", JSONT, nullable=True),
        sa.UniqueConstraint("uuid", name="uq_runs_uuid"),
    )
    op.create_index("ix_runs_commit", "runs", ["commit"])
    op.create_index("ix_runs_branch_gpu_created", "runs", ["branch", "gpu_model_key", "created_at"])
    op.create_index("ix_runs_gpu_created", "runs", ["gpu_model_key", "created_at"])

    op.create_table(
        "variants",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=True),
        sa.Column("source_hash", sa.String(64), nullable=False),
        sa.Column("manifest", JSONT, nullable=True),
        sa.UniqueConstraint("name", "source_hash", name="uq_variants_name_hash"),
    )
    op.create_index("ix_variants_name", "variants", ["name"])

    op.create_table(
        "cases",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("case_id", sa.String(128), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("heads", sa.Integer(), nullable=False),
        sa.Column("kv_heads", sa.Integer(), nullable=False),
        sa.Column("seqlen_q", sa.Integer(), nullable=False),
        sa.Column("seqlen_k", sa.Integer(), nullable=False),
        sa.Column("head_dim", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("mask", sa.String(16), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("case_id", name="uq_cases_case_id"),
    )

    op.create_table(
        "results",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("variant_id", sa.Integer(), sa.ForeignKey("variants.id"), nullable=False),
        sa.Column("case_pk", sa.Integer(), sa.ForeignKey("cases.id"), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("out_err", sa.Double(), nullable=True),
        sa.Column("base_err", sa.Double(), nullable=True),
        sa.Column("err_ratio", sa.Double(), nullable=True),
        sa.Column("lse_err", sa.Double(), nullable=True),
        sa.Column("samples_ms", JSONT, nullable=True),
        sa.Column("median_ms", sa.Double(), nullable=True),
        sa.Column("min_ms", sa.Double(), nullable=True),
        sa.Column("iqr_ms", sa.Double(), nullable=True),
        sa.Column("rel_noise", sa.Double(), nullable=True),
        sa.Column("dropped_throttled", sa.Integer(), nullable=True),
        sa.Column("tflops", sa.Double(), nullable=True),
        sa.Column("flops", sa.BigInteger(), nullable=True),
        sa.Column("bytes_model", sa.BigInteger(), nullable=True),
        sa.Column("bytes_ideal", sa.BigInteger(), nullable=True),
        sa.Column("bytes_read", sa.BigInteger(), nullable=True),
        sa.Column("bytes_write", sa.BigInteger(), nullable=True),
        sa.Column("registers", sa.Integer(), nullable=True),
        sa.Column("spills", sa.Integer(), nullable=True),
        sa.Column("shared_bytes", sa.Integer(), nullable=True),
        sa.Column("extra", JSONT, nullable=True),
        sa.UniqueConstraint("run_id", "variant_id", "case_pk", name="uq_results_run_variant_case"),
    )
    op.create_index("ix_results_variant_case", "results", ["variant_id", "case_pk"])
    op.create_index("ix_results_run", "results", ["run_id"])
    op.create_index("ix_results_status", "results", ["status"])

    op.create_table(
        "comparisons",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("base_run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="SET NULL"),
                  nullable=True),
        sa.Column("variant", sa.String(255), nullable=False),
        sa.Column("case_id", sa.String(128), nullable=False),
        sa.Column("verdict", sa.String(32), nullable=False),
        sa.Column("ratio", sa.Double(), nullable=True),
        sa.Column("p_value", sa.Double(), nullable=True),
        sa.Column("detail", JSONT, nullable=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_comparisons_run", "comparisons", ["run_id"])
    op.create_index("ix_comparisons_verdict", "comparisons", ["verdict"])

    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
    )

    op.create_table(
        "submissions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("submitter", sa.String(255), nullable=False),
        sa.Column("token_id", sa.Integer(), sa.ForeignKey("api_tokens.id"), nullable=True),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("manifest", JSONT, nullable=True),
        sa.Column("source_hash", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=True),
        sa.Column("score", sa.Double(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("failing_cases", JSONT, nullable=True),
        sa.Column("detail", JSONT, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("claimed_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="SET NULL"),
                  nullable=True),
    )
    op.create_index("ix_submissions_status_created", "submissions", ["status", "created_at"])
    op.create_index("ix_submissions_source_hash", "submissions", ["source_hash"])


def downgrade() -> None:
    op.drop_table("submissions")
    op.drop_table("api_tokens")
    op.drop_table("comparisons")
    op.drop_table("results")
    op.drop_table("cases")
    op.drop_table("variants")
    op.drop_table("runs")
