"""The database schema and engine helpers the dashboard reads through.

`harness.records.db.models` and `harness.records.db.engine` depend on SQLAlchemy only (`harness.records.db` loads
its torch-importing record store lazily), so the dashboard imports them directly.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, Engine, func, literal_column

import harness.records.db.engine as engine
import harness.records.db.models as models
from harness.records.db.models import (
    ApiToken,
    Base,
    CaseRow,
    Comparison,
    Result,
    Run,
    Submission,
    Variant,
)

__all__ = [
    "ApiToken", "Base", "CaseRow", "Comparison", "Result", "Run", "Submission", "Variant",
    "engine", "models", "rarely",
]


def rarely(bind: Engine, condition: ColumnElement[bool]) -> ColumnElement[bool]:
    """`condition`, which few rows meet (flagged verdicts, backward passes), marked so for
    SQLite's planner: ANALYZE gives it only per-index averages (a verdict value holds a
    sixth of the table, the one pass name all of it), so it prices these lookups as a
    large part of the table and scans a million rows instead of seeking its index.
    likelihood() corrects the estimate (the term stays indexable); PostgreSQL's per-value
    statistics need no help. (A table hint, `INDEXED BY`, is not rendered by SQLAlchemy's
    SQLite dialect.)"""
    if bind.dialect.name != "sqlite":
        return condition
    # The probability must be a literal constant, not a bound parameter.
    return func.likelihood(condition, literal_column("0.001"))
