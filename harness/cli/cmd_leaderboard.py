"""`fa-harness leaderboard`: scored submissions ranked, plus the latest verdicts; the
forward's board and the backward's (submissions that declare a backward), each ranked by
the same rule (harness.submissions.ranking)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from harness.cli.errors import EXIT_OK, UsageError

TITLES = {"fwd": "fa-harness leaderboard: forward", "bwd": "fa-harness leaderboard: backward"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("leaderboard", help="rank scored submissions",
                       description="Scored submissions ranked by full perf-grid coverage "
                                   "first, then score (geometric mean speedup over the "
                                   "baseline); --all adds every other verdict. The forward "
                                   "and the backward (perf-bwd grid, against the "
                                   "baseline's backward) are ranked on boards of their own.")
    p.add_argument("--db", help="database URL or SQLite path")
    p.add_argument("--json", action="store_true",
                   help="print JSON instead of tables: one list of rows, each with its "
                        "board in 'pass' ('fwd' or 'bwd') and its rank on that board")
    p.add_argument("--all", action="store_true", help="include unscored submissions")
    p.add_argument("--pass", dest="pass_name", choices=("fwd", "bwd", "both"), default="both",
                   help="which board: the forward's, the backward's, or both (default)")
    p.add_argument("--limit", type=int, default=50, help="rows shown per board (default 50)")
    p.set_defaults(func=_leaderboard)


def _leaderboard(args: argparse.Namespace) -> int:
    from harness.records.db import DatabaseError, open_db
    from harness.submissions.ranking import PASSES, leaderboard_rows

    if args.limit < 1:
        raise UsageError(f"--limit must be >= 1, got {args.limit}")
    passes = PASSES if args.pass_name == "both" else (args.pass_name,)
    try:
        # reading only: a database that does not exist is not created here
        db = open_db(args.db, create=False)
    except DatabaseError as e:
        raise UsageError(str(e)) from None
    try:
        boards = {p: leaderboard_rows(db.engine, include_all=args.all, limit=args.limit,
                                      pass_name=p) for p in passes}
    finally:
        db.close()
    if args.json:
        # One flat list (the forward's rows first): a reader of the forward board before
        # there was a backward one still finds its rows, now tagged with their pass.
        print(json.dumps([r for p in passes for r in boards[p]], indent=2, default=str))
        return EXIT_OK
    for p in passes:
        _print_board(p, boards[p], shown_alone=len(passes) == 1)
    return EXIT_OK


def _print_board(pass_name: str, rows: list[dict[str, Any]], *, shown_alone: bool) -> None:
    from rich.table import Table

    from harness.cli.console import console, markup

    table = Table(title=TITLES[pass_name])
    # Names, scores and counts stay whole at 80 columns; the free text folds.
    for col in ("rank", "id", "name", "submitter", "verdict", "score", "coverage", "gpu s",
                "message"):
        table.add_column(col, overflow="fold",
                         no_wrap=col in ("rank", "id", "name", "score", "coverage", "gpu s"))
    for r in rows:
        score = f"{r['score']:.3f}x" if r["score"] is not None else "-"
        # Names, submitters and messages are the submitters' text: escaped, never markup.
        table.add_row(str(r["rank"] or "-"), str(r["id"]), markup(r["name"]),
                      markup(r["submitter"]), markup(r["verdict"] or r["status"]), score,
                      markup(r["coverage"] or "-"), markup(r.get("gpu_s") or "-"),
                      markup((r["message"] or "")[:120]))
    if rows or pass_name == "fwd":
        console().print(table)
    if not rows:
        # An empty backward board is one line, not a table of headers under the forward's.
        print("no submissions yet" if pass_name == "fwd" else
              "no submission with a backward scored yet" if shown_alone else
              "backward board: no submission with a backward scored yet")
