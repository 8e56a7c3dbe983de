"""`fa-harness run`: the correctness suite over every candidate this machine can run,
then (a timing grid: perf, decode, perf-bwd, perf-dims; on a GPU) the timing run.

Every run is stored in the results database (--db, else $FA_HARNESS_DB, else the default
SQLite file; --no-store to skip). Without a terminal (a CI log) it prints one line per
failing case and one per finished candidate as they land; the progress bar is for
terminals only.

Exit codes: 0 every case passed or was skipped; 1 a case failed, crashed, timed out,
errored or was invalid, or a CUDA variant failed to load; 2 bad arguments, or the database
named by --db / $FA_HARNESS_DB unreachable (the run record then waits in the spool)."""

from __future__ import annotations

import argparse

from harness.cli._discoveryopt import add_discovery_options
from harness.cli.console import markup
from harness.cli.errors import EXIT_FAIL, EXIT_OK, EXIT_USAGE, UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="check (and on a GPU, time) candidates over a case grid")
    p.add_argument("--grid", default="smoke",
                   help="smoke | full | perf | decode | perf-bwd | perf-dims | serving | mods "
                        "(default smoke; perf-bwd times the candidates' backward; perf-dims "
                        "times d = 192, 256 and 192/128; mods: docs/score-mods.md)")
    p.add_argument("--backward", action="store_true",
                   help="judge (and on a timing grid, time) each candidate's backward "
                        "(dQ, dK, dV) instead of its forward; candidates without one skip")
    p.add_argument("--kernels", default=None, metavar="NAMES",
                   help="comma-separated candidate names or globs (default: all available)")
    p.add_argument("--cases", default=None, metavar="PATTERNS",
                   help="keep only the grid's cases whose id matches one of these "
                        "comma-separated globs (e.g. '*-fp16-*')")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="only candidates on this device (default: every available one)")
    p.add_argument("--secret", type=int, default=0,
                   help="secret mixed into the input seeds (default 0: public inputs)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per case; > 1 also requires bitwise-equal outputs (race check)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="per-case deadline of isolated candidates (default 300 s)")
    p.add_argument("--baseline", default="sdpa_flash",
                   help="candidate the perf table compares against (default sdpa_flash)")
    p.add_argument("--ncu", action="store_true", help="perf: measure DRAM bytes with ncu")
    p.add_argument("--min-time", type=float, default=None, metavar="S",
                   help="perf: minimum sampling time per measurement (default: the timing "
                        "method's 0.5 s); at least 20 samples are always taken")
    p.add_argument("--json", dest="json_path", metavar="FILE", default=None,
                   help="write every result as JSON to FILE")
    p.add_argument("--record", metavar="FILE", default=None,
                   help="write a versioned run record (harness.records.record) to FILE")
    p.add_argument("--db", metavar="URL", default=None,
                   help="store the run record in this database (SQLAlchemy URL or SQLite "
                        "path); default $FA_HARNESS_DB, else $FA_HARNESS_HOME/results.sqlite")
    p.add_argument("--no-store", action="store_true",
                   help="do not store the run in the results database")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--sanitize", action="store_true",
                   help="first run every CUDA variant under compute-sanitizer (memcheck, "
                        "racecheck, initcheck, synccheck) on a few small cases; a finding "
                        "fails the run")
    add_discovery_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.cli.cmd_kernels import wide_console
    from harness.runs.run_grid import RunOptions, RunUsageError, run_grid

    opts = RunOptions(grid=args.grid, backward=args.backward, kernels=args.kernels,
                      cases=args.cases, device=args.device, secret=args.secret,
                      repeats=args.repeats, timeout_s=args.timeout, baseline=args.baseline,
                      ncu=args.ncu, min_time_s=args.min_time, json_path=args.json_path,
                      record=args.record, db=args.db, no_store=args.no_store,
                      no_progress=args.no_progress, sanitize=args.sanitize)
    try:
        out = run_grid(opts, wide_console(), markup)
    except RunUsageError as e:
        raise UsageError(str(e)) from None
    if out.store_failed:
        return EXIT_USAGE  # the database was unreachable (the record is kept in the spool)
    return EXIT_FAIL if out.failed else EXIT_OK
