"""`fa-harness bisect`: the first bad commit of a timing step whose range spans several
commits, found on this runner.

  fa-harness bisect --alert ID
  fa-harness bisect --good C1 [--bad C2] --kernel K --cases PATTERN

Each commit is checked out in a git worktree (`git worktree add --detach`, removed
afterwards, also on an error or Ctrl-C); its candidates are discovered from the
worktree's kernel folders and only the named candidate is timed on the named cases, the
gate's way. Both ends are timed first (five times each), then a binary search over the
commits between classifies each one by whether its level is nearer the good or the bad
level (a trimmed geometric mean over the cases; each commit timed as often as the ends'
runs say the step needs, 1 to 5; a commit too close to call is timed again). Every run is stored as backfill: in commit order in the history the step search
reads, never a later gate's baseline. With --alert the culprit found is recorded on the
alert. docs/regressions.md, "Bisecting a ranged alert", has the method and its exactness.

Exit codes:
  0  the first bad commit was named
  1  the search stopped before one commit was left (--max-builds, --max-minutes, commits
     that could not be measured); the range it narrowed to is printed
  2  bad input: no git, not a repository, uncommitted changes, a range that is not one
     (the good commit not an ancestor of the bad one), an unknown alert, case or kernel
  3  not measured: no working CUDA GPU on this runner.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli._dbopt import add_db_option
from harness.cli.errors import EXIT_FAIL, EXIT_NOT_MEASURED, EXIT_OK, UsageError

MAX_RUNS = 5  # --runs: more is a benchmark, not a bisection


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bisect", help="find the first bad commit of a ranged timing alert")
    p.add_argument("--alert", type=int, default=None, metavar="ID",
                   help="the alert to bisect: its range, candidate, cases and GPU model")
    p.add_argument("--good", default=None, metavar="COMMIT", help="the last good commit")
    p.add_argument("--bad", default=None, metavar="COMMIT",
                   help="the first bad commit (default HEAD)")
    p.add_argument("--kernel", default=None, metavar="NAME", help="the candidate to time")
    p.add_argument("--cases", default=None, metavar="PATTERN",
                   help="comma-separated case ids or shell globs over the grids' cases "
                        "(with --alert: a subset of its cases)")
    p.add_argument("--max-builds", type=int, default=None, metavar="N",
                   help="distinct commits built and timed, the two ends included "
                        "(default 10)")
    p.add_argument("--max-minutes", type=float, default=None, metavar="M",
                   help="no timing starts once this is spent (default 60)")
    p.add_argument("--end-runs", type=int, default=None, metavar="N",
                   help="timings of each end of the range (default 5)")
    p.add_argument("--runs", type=int, default=None, metavar="N",
                   help="timings of a commit between before it is classified (default: "
                        "1 to 5, as many as the ends' runs say a step that size needs "
                        "where whole runs of this runner shift: docs/regressions.md)")
    p.add_argument("--min-time", type=float, default=0.2, metavar="S",
                   help="sampling time per timed case (default 0.2 s, as ci)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="per-case deadline (default 60 s)")
    p.add_argument("--kernels-dir", action="append", default=[], metavar="DIR",
                   dest="bisect_kernels_dirs",
                   help="a kernels folder of the repository, searched first in each "
                        "commit's worktree (repeatable)")
    p.add_argument("--repo", type=Path, default=Path("."), metavar="DIR",
                   help="the repository (default: the current directory's)")
    p.add_argument("--no-store", action="store_true",
                   help="store no backfill runs (the culprit is still recorded)")
    add_db_option(p)
    p.set_defaults(func=cmd_bisect)


def cmd_bisect(args: argparse.Namespace) -> int:
    from harness.records.bisect import DEFAULT_MAX_BUILDS, END_RUNS
    from harness.runs.bisect_run import (
        DEFAULT_MAX_MINUTES,
        BisectNotMeasured,
        BisectRequest,
        BisectUsageError,
        run_bisect,
    )

    max_builds = DEFAULT_MAX_BUILDS if args.max_builds is None else args.max_builds
    max_minutes = DEFAULT_MAX_MINUTES if args.max_minutes is None else args.max_minutes
    if not max_minutes > 0:
        raise UsageError(f"--max-minutes must be > 0, got {max_minutes:g}")
    end_runs = END_RUNS if args.end_runs is None else args.end_runs
    min_runs = args.runs  # None: as many as the ends' runs say (records.bisect.runs_needed)
    if end_runs < 1:
        raise UsageError(f"--end-runs must be >= 1, got {end_runs}")
    if min_runs is not None and not 1 <= min_runs <= MAX_RUNS:
        raise UsageError(f"--runs must be 1 to {MAX_RUNS}, got {min_runs}")
    for name, v in (("--min-time", args.min_time), ("--timeout", args.timeout)):
        if not v > 0:
            raise UsageError(f"{name} must be > 0 s, got {v:g}")
    req = BisectRequest(repo=args.repo, alert_id=args.alert, good=args.good, bad=args.bad,
                        kernel=args.kernel, cases=args.cases, db_url=args.db,
                        max_builds=max_builds, max_minutes=max_minutes,
                        min_time_s=args.min_time, timeout_s=args.timeout,
                        kernels_dirs=args.bisect_kernels_dirs, store=not args.no_store,
                        end_runs=end_runs, min_runs=min_runs)
    try:
        out = run_bisect(req, log=lambda line: print(line, flush=True))
    except BisectUsageError as exc:
        raise UsageError(str(exc)) from None
    except BisectNotMeasured as exc:
        print(f"fa-harness bisect: not measured: {exc}", file=sys.stderr)
        return EXIT_NOT_MEASURED
    for line in out.lines():
        print(line)
    return EXIT_OK if out.result.exact else EXIT_FAIL
