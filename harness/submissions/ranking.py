"""The leaderboard's ranking rule, shared by `fa-harness leaderboard` and the dashboard.

Each pass has its own board: the forward's, and the backward's for submissions that
declare one (scored on the perf-bwd grid against the baseline's backward). On either,
scored submissions that cover every perf case rank before those covering only part of
the grid (a kernel that declares only the easy cases cannot top the board), then by score
descending (geometric mean speedup over the baseline), then by submission id (earlier
first). Only scores made under the same scoring settings (grids, baseline, timing
budget, perf-case cap: `settings_of`, stored with each score by the worker) are ranked
together: those of the newest score, unless asked for others; scores made under other
settings are listed unranked. SQLAlchemy only: the dashboard imports this module and
must never import torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine, inspect, select

from harness.records.db.engine import session_factory
from harness.records.db.models import Submission, SubmissionPass

# The boards: the forward's (a submission's own verdict) and the backward's (its "bwd"
# entry, harness.submissions.queue.finish), each ranked by the same rule.
FWD, BWD = "fwd", "bwd"
PASSES = (FWD, BWD)
COLUMNS = ("rank", "pass", "id", "name", "submitter", "status", "verdict", "score", "coverage",
           "gpu_s", "message", "failing_cases", "run_id", "created_at", "finished_at")


# Scoring options that change which results are reported, not the score itself.
_NOT_SETTINGS = frozenset({"stop_at_first_failure", "score_backward"})


def settings_of(scoring: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a score is made under, from the worker's scoring options: what must be
    equal for two scores to be compared."""
    return {k: scoring[k] for k in sorted(scoring) if k not in _NOT_SETTINGS}


def settings_key(detail: Mapping[str, Any] | None) -> str:
    """The stored settings of a score as one comparable string ("null" for scores from
    before settings were stored: they are ranked with each other)."""
    return json.dumps((detail or {}).get("settings"), sort_keys=True, default=str)


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


def leaderboard_rows(engine: Engine, *, include_all: bool = False, limit: int = 50,
                     pass_name: str = FWD, settings: Mapping[str, Any] | None = None
                     ) -> list[dict[str, Any]]:
    """Up to `limit` scored submissions of the board of `pass_name` ranked (keys: COLUMNS):
    "fwd", the submissions' own verdicts; "bwd", their backward entries (a submission
    without one is not on that board). Only scores made under `settings` are ranked
    (default: those of the newest score). With `include_all`, up to `limit` other entries
    of that pass follow with rank None: scores made under other settings, then the
    unscored, newest first."""
    if pass_name not in PASSES:
        raise ValueError(f"unknown pass {pass_name!r}; known: {', '.join(PASSES)}")
    if pass_name == FWD:
        src: Any = Submission
        base = select(Submission.id, Submission.name, Submission.submitter,
                      Submission.status, Submission.verdict, Submission.score,
                      Submission.message, Submission.failing_cases, Submission.detail,
                      Submission.run_id, Submission.created_at, Submission.finished_at)
    else:
        if not inspect(engine).has_table(SubmissionPass.__tablename__):
            return []  # a database from before backward entries: nobody is on that board
        src = SubmissionPass
        base = (select(Submission.id, Submission.name, Submission.submitter,
                       Submission.status, SubmissionPass.verdict, SubmissionPass.score,
                       SubmissionPass.message, SubmissionPass.failing_cases,
                       SubmissionPass.detail, Submission.run_id, Submission.created_at,
                       SubmissionPass.finished_at)
                .join(SubmissionPass, SubmissionPass.submission_id == Submission.id)
                .where(SubmissionPass.pass_name == pass_name))
    with session_factory(engine)() as s:
        scored = s.execute(base.where(src.verdict == "scored")).all()
        others = (s.execute(base.where((src.verdict != "scored") | src.verdict.is_(None))
                            .order_by(Submission.id.desc()).limit(limit)).all()
                  if include_all else [])

    def row(r: Any, rank: int | None) -> dict[str, Any]:
        timed, of = coverage(r.detail)
        return {"rank": rank, "pass": pass_name, "id": r.id, "name": r.name,
                "submitter": r.submitter, "status": r.status, "verdict": r.verdict,
                "score": r.score, "coverage": f"{timed}/{of}" if of else None,
                "gpu_s": gpu_seconds(r.detail), "message": r.message,
                "failing_cases": r.failing_cases, "run_id": r.run_id,
                "created_at": r.created_at, "finished_at": r.finished_at}

    if settings is not None:
        ref = settings_key({"settings": dict(settings)})
    else:
        newest = max(scored, key=lambda r: (r.finished_at is not None, r.finished_at or 0,
                                            r.id), default=None)
        ref = settings_key(newest.detail) if newest is not None else ""
    same = [r for r in scored if settings_key(r.detail) == ref]
    apart = sorted((r for r in scored if settings_key(r.detail) != ref),
                   key=lambda r: -r.id)[:limit] if include_all else []
    best = sorted(same, key=lambda r: rank_key(r.score, r.detail, r.id))[:limit]
    return ([row(r, i + 1) for i, r in enumerate(best)]
            + [row(r, None) for r in [*apart, *others]])
