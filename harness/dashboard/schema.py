"""The database schema and engine helpers the dashboard reads through.

`harness.records.db.models` and `harness.records.db.engine` depend on SQLAlchemy only (`harness.records.db` loads
its torch-importing record store lazily), so the dashboard imports them directly.
"""

from __future__ import annotations

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
    "engine", "models",
]
