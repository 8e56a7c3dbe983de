"""`fa-harness leaderboard`: scored submissions ranked, plus the latest verdicts."""

from __future__ import annotations

import argparse
import json

from harness.cli.errors import EXIT_OK, UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("leaderboard", help="rank scored submissions",
                       description="Scored submissions ranked by full perf-grid coverage "
                                   "first, then score (geometric mean speedup over the "
                                   "baseline); --all adds every other verdict.")
    p.add_argument("--db", help="database URL or SQLite path")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--all", action="store_true", help="include unscored submissions")
    p.add_argument("--limit", type=int, default=50, help="rows shown (default 50)")
    p.set_defaults(func=_leaderboard)


def _leaderboard(args: argparse.Namespace) -> int:
    from harness.records.db import DatabaseError, open_db
    from harness.submissions.ranking import leaderboard_rows

    if args.limit < 1:
        raise UsageError(f"--limit must be >= 1, got {args.limit}")
    try:
        # reading only: a database that does not exist is not created here
        db = open_db(args.db, create=False)
    except DatabaseError as e:
        raise UsageError(str(e)) from None
    try:
        rows = leaderboard_rows(db.engine, include_all=args.all, limit=args.limit)
    finally:
        db.close()
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return EXIT_OK
    from rich.table import Table

    table = Table(title="fa-harness leaderboard")
    # Names, scores and counts stay whole at 80 columns; the free text folds.
    for col in ("rank", "id", "name", "submitter", "verdict", "score", "coverage", "gpu s",
                "message"):
        table.add_column(col, overflow="fold",
                         no_wrap=col in ("rank", "id", "name", "score", "coverage", "gpu s"))
    for r in rows:
        score = f"{r['score']:.3f}x" if r["score"] is not None else "-"
        table.add_row(str(r["rank"] or "-"), str(r["id"]), r["name"], r["submitter"],
                      r["verdict"] or r["status"], score, r["coverage"] or "-",
                      r.get("gpu_s") or "-", (r["message"] or "")[:120])
    from harness.cli.console import console

    console().print(table)
    if not rows:
        print("no submissions yet")
    return EXIT_OK
