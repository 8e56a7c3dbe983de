"""Where fa-harness keeps its files on a runner: the default database and the spool.

One small module, importable without SQLAlchemy or torch, because both the record format
(which spools) and the database engine (which opens the default SQLite file) need it.
"""

from __future__ import annotations

import os
from pathlib import Path


def home_dir() -> Path:
    """FA_HARNESS_HOME, else the XDG data directory of the project."""
    env = os.environ.get("FA_HARNESS_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "fa-harness"


def spool_dir() -> Path:
    """Run records that could not be stored wait here (next to the default database)."""
    env = os.environ.get("FA_HARNESS_SPOOL")
    return Path(env).expanduser() if env else home_dir() / "spool"
