"""The spool: run records waiting for their database.

A record is written here first (`<uuid>.json`, with the database it is meant for in
`<uuid>.target`) and removed once that database has it; a record that database refuses is
moved to `rejected/` with the reason next to it (`<uuid>.reason`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness.records.paths import spool_dir


def spool(record: Any, directory: str | Path | None = None, *,
          target: str | None = None) -> Path:
    """Keep a record (a RunRecord) until the database takes it (file name: its uuid). `target`: the
    database it is meant for (harness.records.db.engine.target_of), kept next to it as
    `<uuid>.target`, so a later import into another database leaves it waiting."""
    d = Path(directory) if directory is not None else spool_dir()
    if target is not None:
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{record.uuid}.target").write_text(target + "\n", encoding="utf-8")
    return record.write(d / f"{record.uuid}.json")


def spool_target(path: str | Path) -> str | None:
    """The database a spooled record is meant for; None: any (spooled without one)."""
    try:
        text = Path(path).with_suffix(".target").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def set_aside(path: str | Path, reason: str) -> Path:
    """Move a spooled record that cannot be stored to `<spool>/rejected/`, its reason in
    `<name>.reason`, so it no longer stands in the way of the others; returns its new path."""
    path = Path(path)
    d = path.parent / "rejected"
    d.mkdir(exist_ok=True)
    dest = d / path.name
    os.replace(path, dest)
    target = path.with_suffix(".target")
    if target.exists():
        os.replace(target, d / target.name)
    (d / f"{path.stem}.reason").write_text(reason + "\n", encoding="utf-8")
    return dest


def spooled(directory: str | Path | None = None) -> list[Path]:
    d = Path(directory) if directory is not None else spool_dir()
    return sorted(p for p in d.glob("*.json") if p.is_file()) if d.is_dir() else []
