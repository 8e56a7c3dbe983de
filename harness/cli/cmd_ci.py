"""`fa-harness ci`: run the grids, record, store, compare with the baseline, summarise.

Exit 0: everything passed and nothing regressed; 1: a failure or a regression; 2: bad
input (unknown grid or kernel). An unreachable database does not lose the run: the record
stays in the spool and the summary says so."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli import UsageError
from harness.cli._dbopt import add_db_option
from harness.cli._discoveryopt import add_discovery_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ci", help="the CI gate: run, record, store, compare, summarise")
    p.add_argument("--grid", default="smoke,perf",
                   help="comma-separated grids (default smoke,perf; timing grids need a GPU)")
    p.add_argument("--kernels", default=None,
                   help="comma-separated candidate names (default: all runnable here)")
    p.add_argument("--baseline-branch", default="main",
                   help="branch whose recent runs are the baseline when the parent commit "
                        "has no run (default main)")
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
    opts = GateOptions(grids=grids, kernels=_split(args.kernels), db_url=args.db,
                       baseline_branch=args.baseline_branch, window=args.window,
                       summary=args.summary, record_path=args.record, secret=args.secret)
    try:
        out = run_gate(opts)
    except GateUsageError as exc:
        raise UsageError(str(exc)) from None
    print(out.summary)
    return out.exit_code
