"""The leaderboard's ranking rule, shared by `fa-harness leaderboard` and the dashboard.

Scored submissions that cover every perf case rank before those covering only part of
the grid (a kernel that declares only the easy cases cannot top the board), then by score
descending (geometric mean speedup over the baseline), then by submission id (earlier
first). SQLAlchemy only: the dashboard imports this module and must never import torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine, select

from harness.records.db.engine import session_factory
from harness.records.db.models import Submission

COLUMNS = ("rank", "id", "name", "submitter", "status", "verdict", "score", "coverage",
           "gpu_s", "message", "failing_cases", "run_id", "created_at", "finished_at")


def gpu_seconds(detail: Mapping[str, Any] | None) -> str | None:
    """"used/budget" GPU seconds of a job: the scoring child's wall time on its GPU (the
    worker's `elapsed_s`, else the scorer's own count) against the job's budget."""
    d = detail or {}
    used = d.get("elapsed_s", d.get("gpu_s"))
    if used is None:
        return None
    budget = d.get("gpu_budget_s")
    return f"{float(used):.0f}" + (f"/{float(budget):.0f}" if budget else "")


def coverage(detail: Mapping[str, Any] | None) -> tuple[int, int]:
    """(perf cases timed, perf cases in the grid) recorded by the scorer; (0, 0) if none."""
    cov = (detail or {}).get("coverage") or {}
    return int(cov.get("timed", 0)), int(cov.get("of", 0))


def rank_key(score: float | None, detail: Mapping[str, Any] | None,
             submission_id: int) -> tuple[int, float, int]:
    """Sort key of a scored submission: full coverage first, then score, then id."""
    timed, of = coverage(detail)
    return (0 if of and timed == of else 1, -(score or 0.0), submission_id)


def leaderboard_rows(engine: Engine, *, include_all: bool = False,
                     limit: int = 50) -> list[dict[str, Any]]:
    """Up to `limit` scored submissions ranked (keys: COLUMNS). With `include_all`, up to
    `limit` other submissions follow, newest first, with rank None."""
    cols = (Submission.id, Submission.name, Submission.submitter, Submission.status,
            Submission.verdict, Submission.score, Submission.message,
            Submission.failing_cases, Submission.detail, Submission.run_id,
            Submission.created_at, Submission.finished_at)
    with session_factory(engine)() as s:
        scored = s.execute(select(*cols).where(Submission.verdict == "scored")).all()
        others = (s.execute(select(*cols)
                            .where((Submission.verdict != "scored")
                                   | Submission.verdict.is_(None))
                            .order_by(Submission.id.desc()).limit(limit)).all()
                  if include_all else [])

    def row(r: Any, rank: int | None) -> dict[str, Any]:
        timed, of = coverage(r.detail)
        return {"rank": rank, "id": r.id, "name": r.name, "submitter": r.submitter,
                "status": r.status, "verdict": r.verdict, "score": r.score,
                "coverage": f"{timed}/{of}" if of else None,
                "gpu_s": gpu_seconds(r.detail), "message": r.message,
                "failing_cases": r.failing_cases, "run_id": r.run_id,
                "created_at": r.created_at, "finished_at": r.finished_at}

    best = sorted(scored, key=lambda r: rank_key(r.score, r.detail, r.id))[:limit]
    return [row(r, i + 1) for i, r in enumerate(best)] + [row(r, None) for r in others]
