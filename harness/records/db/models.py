"""The results database schema: SQLAlchemy 2 typed models.

Table and column names are a contract: the dashboard reads them, the submission queue
writes `submissions` and `api_tokens`, and Alembic migrations under
`harness/records/db/migrations/versions/` create them. Change a column only together with a new
migration.

Timestamps are stored in UTC. SQLite has no time zone type, so `UTCDateTime` stores naive
UTC and hands back aware datetimes on both backends; code never sees a naive timestamp.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

# JSONB on PostgreSQL (indexable, compact), plain JSON text elsewhere.
JSONType = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every backend (SQLite drops the offset otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; pass an aware datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {
        dict[str, Any]: JSONType,
        list[Any]: JSONType,
        datetime: UTCDateTime(),
        float: Double(),
    }


RUN_SOURCES = ("ci", "cli", "import", "submission", "benchmark")
SUBMISSION_STATUSES = ("queued", "running", "done", "error")
SUBMISSION_VERDICTS = ("scored", "incorrect", "invalid", "rejected", "crashed", "timeout")
VERDICTS = ("regression", "improvement", "same", "inconclusive",
            "correctness_regression", "correctness_fixed", "precision_drift", "missing", "new")


class Run(Base):
    """One invocation of the harness on one runner (one JSON run record)."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36))
    commit: Mapped[str | None] = mapped_column(String(64), index=True)
    parent_commit: Mapped[str | None] = mapped_column(String(64))
    branch: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    source: Mapped[str] = mapped_column(String(16), default="cli")
    gpu_name: Mapped[str | None] = mapped_column(String(255))
    gpu_uuid: Mapped[str | None] = mapped_column(String(64))
    gpu_model_key: Mapped[str | None] = mapped_column(String(128))
    driver: Mapped[str | None] = mapped_column(String(64))
    cuda: Mapped[str | None] = mapped_column(String(64))
    torch: Mapped[str | None] = mapped_column(String(64))
    cupy: Mapped[str | None] = mapped_column(String(64))
    python: Mapped[str | None] = mapped_column(String(64))
    hostname: Mapped[str | None] = mapped_column(String(255))
    clocks: Mapped[dict[str, Any] | None]
    calibration: Mapped[dict[str, Any] | None]
    grids: Mapped[list[Any] | None]
    schema_version: Mapped[int] = mapped_column(Integer, default=1)
    record_sha256: Mapped[str | None] = mapped_column(String(64))
    env: Mapped[dict[str, Any] | None]
    # Who stored it, by which path (harness.records.db.store.Origin), not what the record
    # claims; only trusted runs become baselines or noise history (migration 0007).
    origin: Mapped[str | None] = mapped_column(String(255))
    trusted: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())

    results: Mapped[list[Result]] = relationship(back_populates="run",
                                                 cascade="all, delete-orphan")

    __table_args__ = (
        UniqueConstraint("uuid", name="uq_runs_uuid"),
        # Baseline lookups: latest run on a branch / commit for one GPU model.
        Index("ix_runs_branch_gpu_created", "branch", "gpu_model_key", "created_at"),
        Index("ix_runs_gpu_created", "gpu_model_key", "created_at"),
    )


class Variant(Base):
    """A kernel or candidate at one source version (name + hash of its sources)."""

    __tablename__ = "variants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), index=True)
    kind: Mapped[str | None] = mapped_column(String(16))
    source_hash: Mapped[str] = mapped_column(String(64), default="")
    manifest: Mapped[dict[str, Any] | None]

    __table_args__ = (UniqueConstraint("name", "source_hash", name="uq_variants_name_hash"),)


class CaseRow(Base):
    """One test case, keyed by its stable `Case.id` string."""

    __tablename__ = "cases"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    case_id: Mapped[str] = mapped_column(String(128))
    batch: Mapped[int] = mapped_column(Integer)
    heads: Mapped[int] = mapped_column(Integer)
    kv_heads: Mapped[int] = mapped_column(Integer)
    seqlen_q: Mapped[int] = mapped_column(Integer)
    seqlen_k: Mapped[int] = mapped_column(Integer)
    head_dim: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    mask: Mapped[str] = mapped_column(String(16))
    seed: Mapped[int] = mapped_column(BigInteger, default=0)
    # The serving kinds (migration 0004): window, layout, pages, full lengths.
    window_left: Mapped[int] = mapped_column(Integer, default=-1, server_default="-1")
    window_right: Mapped[int] = mapped_column(Integer, default=-1, server_default="-1")
    layout: Mapped[str] = mapped_column(String(8), default="dense", server_default="dense")
    page_size: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    full_lengths: Mapped[bool] = mapped_column(Boolean, default=False,
                                               server_default=false())

    __table_args__ = (UniqueConstraint("case_id", name="uq_cases_case_id"),)


class Result(Base):
    """Outcome of one (run, variant, case, pass): status, errors, timing, FLOPs and bytes."""

    __tablename__ = "results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    variant_id: Mapped[int] = mapped_column(ForeignKey("variants.id"))
    case_pk: Mapped[int] = mapped_column(ForeignKey("cases.id"))
    status: Mapped[str] = mapped_column(String(16))
    message: Mapped[str | None] = mapped_column(Text)
    out_err: Mapped[float | None]
    base_err: Mapped[float | None]
    err_ratio: Mapped[float | None]
    lse_err: Mapped[float | None]
    samples_ms: Mapped[list[Any] | None]
    median_ms: Mapped[float | None]
    min_ms: Mapped[float | None]
    iqr_ms: Mapped[float | None]
    rel_noise: Mapped[float | None]
    dropped_throttled: Mapped[int | None] = mapped_column(Integer)
    tflops: Mapped[float | None]
    flops: Mapped[int | None] = mapped_column(BigInteger)
    bytes_model: Mapped[int | None] = mapped_column(BigInteger)
    bytes_ideal: Mapped[int | None] = mapped_column(BigInteger)
    bytes_read: Mapped[int | None] = mapped_column(BigInteger)
    bytes_write: Mapped[int | None] = mapped_column(BigInteger)
    registers: Mapped[int | None] = mapped_column(Integer)
    spills: Mapped[int | None] = mapped_column(Integer)
    shared_bytes: Mapped[int | None] = mapped_column(Integer)
    extra: Mapped[dict[str, Any] | None]
    # "fwd" or "bwd": a candidate's backward is an entry of its own (migration 0002).
    pass_name: Mapped[str] = mapped_column(String(8), default="fwd", server_default="fwd")

    run: Mapped[Run] = relationship(back_populates="results")
    variant: Mapped[Variant] = relationship()
    case: Mapped[CaseRow] = relationship()

    __table_args__ = (
        UniqueConstraint("run_id", "variant_id", "case_pk", "pass_name",
                         name="uq_results_run_variant_case_pass"),
        # History of one kernel on one case (dashboard, baselines).
        Index("ix_results_variant_case", "variant_id", "case_pk"),
        Index("ix_results_run", "run_id"),
        Index("ix_results_status", "status"),
        # Which variants have a backward (the dashboard's candidate list), without
        # reading every forward result (migration 0003).
        Index("ix_results_pass_variant", "pass_name", "variant_id"),
    )


class Comparison(Base):
    """A regression verdict of one (variant, case) between a run and its baseline."""

    __tablename__ = "comparisons"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    base_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    variant: Mapped[str] = mapped_column(String(255))
    case_id: Mapped[str] = mapped_column(String(128))
    verdict: Mapped[str] = mapped_column(String(32))
    ratio: Mapped[float | None]
    p_value: Mapped[float | None]
    detail: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    pass_name: Mapped[str] = mapped_column(String(8), default="fwd", server_default="fwd")

    __table_args__ = (
        Index("ix_comparisons_run", "run_id"),
        Index("ix_comparisons_verdict", "verdict"),
    )


class ApiToken(Base):
    """A submission token; only its sha256 is stored, never the token itself."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    token_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)

    __table_args__ = (UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),)


class Submission(Base):
    """A kernel variant submitted for scoring, and its place in the worker queue."""

    __tablename__ = "submissions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    submitter: Mapped[str] = mapped_column(String(255))
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"))
    # The variant folder packed as JSON text {filename: text}.
    source: Mapped[str] = mapped_column(Text)
    manifest: Mapped[dict[str, Any] | None]
    source_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    verdict: Mapped[str | None] = mapped_column(String(16))
    score: Mapped[float | None]
    message: Mapped[str | None] = mapped_column(Text)
    failing_cases: Mapped[list[Any] | None]
    detail: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    claimed_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    worker: Mapped[str | None] = mapped_column(String(255))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    # A running job's liveness (harness.submissions.queue): renewed by its worker with the
    # database's clock, never the worker's; the claim's token makes its store idempotent.
    heartbeat_at: Mapped[datetime | None]
    claim_token: Mapped[str | None] = mapped_column(String(32))

    __table_args__ = (
        # Queue claim: oldest queued first.
        Index("ix_submissions_status_created", "status", "created_at"),
        Index("ix_submissions_source_hash", "source_hash"),
    )


class SubmissionPass(Base):
    """The verdict and score of one more pass of a submission than its forward (whose
    verdict is the `submissions` row itself): its backward, `pass_name` "bwd". Its own
    entry, ranked on its own board: a failed backward leaves the forward's score alone."""

    __tablename__ = "submission_passes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    submission_id: Mapped[int] = mapped_column(
        ForeignKey("submissions.id", ondelete="CASCADE"))
    pass_name: Mapped[str] = mapped_column(String(8))
    verdict: Mapped[str] = mapped_column(String(16))
    score: Mapped[float | None]
    message: Mapped[str | None] = mapped_column(Text)
    failing_cases: Mapped[list[Any] | None]
    detail: Mapped[dict[str, Any] | None]
    finished_at: Mapped[datetime | None]

    __table_args__ = (
        UniqueConstraint("submission_id", "pass_name", name="uq_submission_passes_pass"),
        Index("ix_submission_passes_board", "pass_name", "verdict"),
    )


ALERT_STATES = ("open", "acknowledged", "accepted", "recovered", "withdrawn")
ALERT_KINDS = ("timing", "correctness")


class AlertRow(Base):
    """One step of a (GPU model, variant, pass) from the commit it began at, and its
    triage: the per-case verdicts in `comparisons` flag, an alert is what a person acts
    on (migration 0006). `harness.records.alerts` writes and reads it."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_model_key: Mapped[str] = mapped_column(String(128))
    variant: Mapped[str] = mapped_column(String(255))
    pass_name: Mapped[str] = mapped_column(String(8), default="fwd", server_default="fwd")
    kind: Mapped[str] = mapped_column(String(16))
    # The flagging verdict: "regression", "correctness_regression" or "precision_drift".
    verdict: Mapped[str] = mapped_column(String(32))
    # False for a yardstick (the SDPA peers, a shipped variant): never fails the gate.
    owned: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    state: Mapped[str] = mapped_column(String(16), default="open", server_default="open")
    first_bad_commit: Mapped[str | None] = mapped_column(String(64))
    last_good_commit: Mapped[str | None] = mapped_column(String(64))
    first_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL"))
    last_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL"))
    # Runs after the first that flagged it again: 0 is not yet confirmed.
    confirmations: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cases: Mapped[list[Any] | None]
    worst_ratio: Mapped[float | None]
    worst_case: Mapped[str | None] = mapped_column(String(128))
    who: Mapped[str | None] = mapped_column(String(255))
    reason: Mapped[str | None] = mapped_column(Text)
    link: Mapped[str | None] = mapped_column(Text)
    culprit_commit: Mapped[str | None] = mapped_column(String(64))
    detail: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ix_alerts_state_gpu", "state", "gpu_model_key"),
        Index("ix_alerts_series", "gpu_model_key", "variant", "pass_name"),
    )


__all__ = [
    "ALERT_KINDS", "ALERT_STATES", "AlertRow", "ApiToken", "Base", "CaseRow", "Comparison", "JSONType", "RUN_SOURCES", "Result", "Run",
    "SUBMISSION_STATUSES", "SUBMISSION_VERDICTS", "Submission", "SubmissionPass",
    "UTCDateTime", "VERDICTS", "Variant", "utcnow",
]
