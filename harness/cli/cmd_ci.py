"""`fa-harness ci`: plan to the budget, run the grids, record, store, compare with the
baseline, summarise.

Exit 0: nothing of the team failed or regressed (peers' divergences are reported, not
failed); 1: a team candidate failed a case or did not load, a regression against the
baseline, or a baseline candidate/case missing without the plan or --kernels leaving it
out; 2: bad input (unknown grid or kernel, bad option). An unreachable database does not
lose the run: the record stays in the spool and the summary says so."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli import UsageError
from harness.cli._dbopt import add_db_option
from harness.cli._discoveryopt import add_discovery_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ci", help="the CI gate: run, record, store, compare, summarise")
    p.add_argument("--grid", default="smoke,perf,decode",
                   help="comma-separated grids (default smoke,perf,decode; timing grids "
                        "need a GPU)")
    p.add_argument("--budget", type=float, default=5.0, metavar="MINUTES",
                   help="plan the run to fit this many minutes (default 5): every candidate "
                        "is checked, timing follows each manifest's `timing` and the budget")
    p.add_argument("--min-time", type=float, default=0.2, metavar="S",
                   help="sampling time per timed case (default 0.2 s, >= 20 samples)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="per-case deadline; a candidate that hangs is stopped there "
                        "(default 60 s)")
    p.add_argument("--kernels", default=None,
                   help="comma-separated candidate names (default: all runnable here)")
    p.add_argument("--baseline-branch", default="main",
                   help="branch whose recent runs are the baseline when the parent commit "
                        "has no run (default main)")
    p.add_argument("--baseline", default=None, metavar="RUN",
                   help="compare with this stored run (id or uuid) instead of the parent "
                        "commit's / the baseline branch's runs")
    p.add_argument("--window", type=int, default=5,
                   help="runs of the baseline branch pooled as baseline (default 5)")
    p.add_argument("--summary", type=Path, default=None,
                   help="markdown summary file (default: $GITHUB_STEP_SUMMARY when set)")
    p.add_argument("--record", type=Path, default=None,
                   help="also write the run record here (e.g. a CI artifact)")
    p.add_argument("--secret", type=int, default=0, help="input secret (0: public inputs)")
    add_db_option(p)
    add_discovery_options(p)
    p.set_defaults(func=cmd_ci)


def _split(s: str | None) -> list[str] | None:
    if s is None:
        return None
    items = [x.strip() for x in s.split(",") if x.strip()]
    return items or None


def cmd_ci(args: argparse.Namespace) -> int:
    from harness.records.gate import GateOptions, GateUsageError, run_gate

    grids = _split(args.grid)
    if not grids:
        raise UsageError("--grid needs at least one grid name")
    if args.window < 1:
        raise UsageError("--window must be >= 1")
    if not args.budget > 0:
        raise UsageError(f"--budget must be > 0 minutes, got {args.budget:g}")
    if not args.min_time > 0:
        raise UsageError(f"--min-time must be > 0 s, got {args.min_time:g}")
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be > 0 s, got {args.timeout:g}")
    if args.secret < 0:
        raise UsageError(f"--secret must be >= 0, got {args.secret}")
    opts = GateOptions(grids=grids, kernels=_split(args.kernels), db_url=args.db,
                       baseline_branch=args.baseline_branch, window=args.window,
                       summary=args.summary, record_path=args.record, secret=args.secret,
                       budget_min=args.budget, min_time_s=args.min_time,
                       timeout_s=args.timeout, baseline_run=args.baseline)
    try:
        out = run_gate(opts, log=lambda line: print(line, flush=True))
    except GateUsageError as exc:
        raise UsageError(str(exc)) from None
    print(out.summary)
    return out.exit_code
