"""The database schema and engine helpers the dashboard reads through.

`harness.db.models` and `harness.db.engine` depend on SQLAlchemy only (`harness.db` loads
its torch-importing record store lazily), so the dashboard imports them directly.
"""

from __future__ import annotations

import harness.db.engine as engine
import harness.db.models as models
from harness.db.models import (
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
