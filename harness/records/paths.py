"""Where fa-harness keeps its files on a runner: the default database and the spool.

One small module, importable without SQLAlchemy or torch, because both the record format
(which spools) and the database engine (which opens the default SQLite file) need it.
The home folder itself is harness.paths's (the compile caches live under it too).
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.paths import home_dir

__all__ = ["home_dir", "spool_dir"]


def spool_dir() -> Path:
    """Run records that could not be stored wait here (next to the default database)."""
    env = os.environ.get("FA_HARNESS_SPOOL")
    return Path(env).expanduser() if env else home_dir() / "spool"
