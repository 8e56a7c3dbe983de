"""`fa-harness ci`: the CI gate. It checks every candidate, times the team's own first,
records the run, stores it, compares it with the baseline and writes a summary.

Owned candidates (your kernel folders, your Python candidates, anything --kernels names)
are timed on at least their floor of cases (timing-min, default 8) before any yardstick
(the SDPA peers, the variants shipped with fa-harness, and what --yardsticks or
[tool.fa-harness] yardsticks declares, e.g. a third-party kernel brought for comparison:
timed and reported, never a failure) is; compile caches are warmed and correctness runs
side by side before the clock starts; the owned CUDA variants go through compute-sanitizer
(memcheck, initcheck, racecheck on a few small cases) where it is installed.

Exit codes:
  0  nothing of the team failed or regressed, and every owned candidate was measured
  1  a team candidate failed a case, did not load, had a sanitizer finding or regressed
     against the baseline, or a baseline candidate/case is missing without the plan or
     --kernels leaving it out
  2  bad input (unknown grid or kernel, bad option, bad [tool.fa-harness] setting)
  3  not measured: nothing failed, but an owned candidate that should run here did not
     (no GPU, unavailable) or got fewer timed cases than its floor; also --require-gpu on
     a runner without a working GPU, and nothing of the team's found to judge (no owned
     candidate, none named by --kernels: one line, before anything runs)
  130  interrupted (Ctrl-C): one line
An unreachable database does not lose the run: the record stays in the spool and the
summary says so.

`--bisect [MINUTES]`: when the run opened an alert of a team candidate
whose range spans several commits, `fa-harness bisect --alert ID` runs on it here, within
MINUTES (default 30), and the alert then names the first bad commit. The exit code stays
the gate's.

`--confirm-runs N` (default 4, 0: never): before the run is judged, an owned candidate
whose source changed and whose cases read slower as a whole (p < 0.2, at least +0.5%),
or whose series the step search would call a new level here, is timed N more times,
each in a fresh timing child, and judged on the mean of its runs; in a git repository
the parent commit's code of a changed candidate is timed as often from a worktree
(docs/regressions.md, "Confirmation runs")."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli._dbopt import add_db_option
from harness.cli._discoveryopt import add_discovery_options
from harness.cli.errors import EXIT_NOT_MEASURED, UsageError
from harness.cli.helpfmt import DocstringFormatter

if TYPE_CHECKING:
    from harness.runs.gate import GateOptions, GateOutcome

DEFAULT_BISECT_MINUTES = 30.0
# harness.records.confirm.CONFIRM_RUNS, kept here so that --help imports no statistics
# (tests/test_confirm.py holds them equal).
DEFAULT_CONFIRM_RUNS = 4


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ci", help="the CI gate: run, record, store, compare, summarise",
                       description=__doc__, formatter_class=DocstringFormatter)
    p.add_argument("--grid", default="smoke,perf,decode",
                   help="comma-separated grids (default smoke,perf,decode; timing grids "
                        "need a GPU)")
    p.add_argument("--budget", type=float, default=5.0, metavar="MINUTES",
                   help="plan the run to fit this many minutes (default 5); the owned "
                        "candidates' floors of timed cases are kept even past it")
    p.add_argument("--min-time", type=float, default=0.2, metavar="S",
                   help="sampling time per timed case (default 0.2 s, >= 20 samples)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="per-case deadline; a candidate that hangs is stopped there "
                        "(default 60 s)")
    p.add_argument("--kernels", default=None, metavar="NAMES",
                   help="comma-separated candidate names or globs (default: all runnable "
                        "here); the candidates named are timed as owned")
    p.add_argument("--yardsticks", default=None, metavar="NAMES",
                   help="comma-separated candidate names or globs timed and compared for "
                        "reference only: recorded as not the team's, reported, never a "
                        "failure (default: [tool.fa-harness] yardsticks)")
    p.add_argument("--require-gpu", action="store_true",
                   help="exit 3 at once when this runner has no working CUDA GPU")
    p.add_argument("--sanitize", choices=("fast", "full", "none"), default=None,
                   help="compute-sanitizer on the owned CUDA variants: fast (memcheck, "
                        "initcheck, racecheck on 1-2 small cases; the default where "
                        "compute-sanitizer is installed), full (every tool, more cases), "
                        "none")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="child processes side by side for warm-up, correctness and the "
                        "sanitizer (default: one per CPU core on a GPU runner, at most 16)")
    p.add_argument("--timing-min", type=int, default=None, metavar="N",
                   help="floor of timed cases per owned candidate, over a manifest's "
                        "timing_min too (default: the manifest's, else [tool.fa-harness] "
                        "timing-min, else 8)")
    p.add_argument("--timing-cases", type=int, default=None, metavar="N",
                   help="timed cases per owned candidate when time allows, over a manifest's "
                        "timing_cases too (default: the manifest's, else [tool.fa-harness] "
                        "timing-cases, else 16)")
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
    p.add_argument("--bisect", type=float, nargs="?", const=DEFAULT_BISECT_MINUTES,
                   default=None, metavar="MINUTES",
                   help="bisect the ranged alerts this run opened, within MINUTES (default "
                        f"{DEFAULT_BISECT_MINUTES:g}); the alert then names one commit")
    p.add_argument("--confirm-runs", type=int, default=None, metavar="N",
                   help="time a suspect candidate N more times before judging (default "
                        f"{DEFAULT_CONFIRM_RUNS}; 0: never)")
    add_db_option(p)
    add_discovery_options(p)
    p.set_defaults(func=cmd_ci)


def _split(s: str | None) -> list[str] | None:
    if s is None:
        return None
    items = [x.strip() for x in s.split(",") if x.strip()]
    return items or None


def _check(args: argparse.Namespace) -> None:
    if args.yardsticks is not None and not _split(args.yardsticks):
        raise UsageError("--yardsticks needs at least one candidate name or glob")
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
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    if args.bisect is not None and not args.bisect > 0:
        raise UsageError(f"--bisect must be > 0 minutes, got {args.bisect:g}")
    if args.confirm_runs is not None and not 0 <= args.confirm_runs <= 8:
        raise UsageError(f"--confirm-runs must be 0 to 8, got {args.confirm_runs}")
    for name in ("timing_min", "timing_cases"):
        v = getattr(args, name)
        if v is not None and v < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {v}")


def cmd_ci(args: argparse.Namespace) -> int:
    from harness.runs.gate import GateNotMeasured, GateOptions, GateUsageError, run_gate

    grids = _split(args.grid)
    if not grids:
        raise UsageError("--grid needs at least one grid name")
    _check(args)
    opts = GateOptions(grids=grids, kernels=_split(args.kernels),
                       yardsticks=_split(args.yardsticks), db_url=args.db,
                       baseline_branch=args.baseline_branch, window=args.window,
                       summary=args.summary, record_path=args.record, secret=args.secret,
                       budget_min=args.budget, min_time_s=args.min_time,
                       timeout_s=args.timeout, baseline_run=args.baseline,
                       require_gpu=args.require_gpu, sanitize=args.sanitize, jobs=args.jobs,
                       timing_min=args.timing_min, timing_cases=args.timing_cases,
                       bisect_minutes=args.bisect, confirm_runs=args.confirm_runs)
    try:
        out = run_gate(opts, log=lambda line: print(line, flush=True))
    except GateUsageError as exc:
        raise UsageError(str(exc)) from None
    except GateNotMeasured as exc:
        print(f"fa-harness ci: not measured: {exc}", file=sys.stderr)
        return EXIT_NOT_MEASURED
    print(out.summary)
    if opts.bisect_minutes is not None:
        _bisect(out, opts, args)
    return out.exit_code


def _bisect(out: GateOutcome, opts: GateOptions, args: argparse.Namespace) -> None:
    """`--bisect`: the ranged alerts of this run bisected; the lines printed and added
    to the step summary under the gate's."""
    import os

    from harness.runs.bisect_run import bisect_after_gate

    lines = bisect_after_gate(out, db_url=opts.db_url, max_minutes=opts.bisect_minutes or 0.0,
                              min_time_s=opts.min_time_s, timeout_s=opts.timeout_s,
                              kernels_dirs=list(args.kernels_dirs),
                              log=lambda line: print(line, flush=True))
    if not lines:
        lines = ["bisect: no alert of this run spans several commits"]
    for line in lines:
        print(line)
    target = opts.summary or (Path(os.environ["GITHUB_STEP_SUMMARY"])
                              if os.environ.get("GITHUB_STEP_SUMMARY") else None)
    if target is not None:
        with open(target, "a", encoding="utf-8") as f:
            f.write("\n### Bisect\n\n```\n" + "\n".join(lines) + "\n```\n")
