"""`fa-harness worker`: claim queued submissions and score them, one child per job."""

from __future__ import annotations

import argparse
import signal
import sys

from harness.cli import EXIT_OK, UsageError
from harness.cli._discoveryopt import add_discovery_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker", help="score queued submissions on one GPU",
        description="Claims queued submissions and scores each in an isolated child process "
                    "(CUDA_VISIBLE_DEVICES=N) with time and memory limits. The secret case "
                    "seed comes from FA_HARNESS_SECRET (else random per worker start).")
    p.add_argument("--gpu", type=int, default=None, help="GPU index for the children")
    p.add_argument("--once", action="store_true", help="score at most one job, then exit")
    p.add_argument("--drain", action="store_true", help="exit when the queue is empty")
    p.add_argument("--db", help="database URL or SQLite path")
    p.add_argument("--case-timeout", type=float, default=300.0, metavar="S",
                   help="kill a job with no progress for S seconds (default 300)")
    p.add_argument("--startup-timeout", type=float, default=120.0, metavar="S",
                   help="allowance for the scoring process to start (default 120)")
    p.add_argument("--job-timeout", type=float, default=3600.0, metavar="S")
    p.add_argument("--memory-limit-mb", type=int, default=32768)
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--lease", type=float, default=None, metavar="S",
                   help="re-queue jobs claimed longer ago than S (default job timeout + 600)")
    p.add_argument("--baseline", default="sdpa_flash")
    p.add_argument("--perf-grid", default="perf")
    p.add_argument("--correctness-grid", default="full")
    p.add_argument("--max-perf-cases", type=int, default=None)
    p.add_argument("--stop-at-first-failure", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="fewer timing samples (demos): 5 samples, at most 2 s per case")
    add_discovery_options(p)
    p.set_defaults(func=_worker)


def _worker(args: argparse.Namespace) -> int:
    from harness.records.db import DatabaseError, open_db
    from harness.submissions.worker import WorkerConfig, work

    for name in ("case_timeout", "job_timeout"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0")
    try:
        db = open_db(args.db)
    except DatabaseError as e:
        raise UsageError(str(e)) from None
    scoring = {"baseline": args.baseline, "perf_grid": args.perf_grid,
               "correctness_grid": args.correctness_grid,
               "max_perf_cases": args.max_perf_cases,
               "stop_at_first_failure": args.stop_at_first_failure}
    if args.quick:
        scoring.update(min_samples=5, min_time_s=0.05, max_time_s=2.0)
    config = WorkerConfig(gpu=args.gpu, case_timeout_s=args.case_timeout,
                          startup_timeout_s=args.startup_timeout,
                          job_timeout_s=args.job_timeout, memory_limit_mb=args.memory_limit_mb,
                          max_attempts=args.max_attempts, lease_s=args.lease, scoring=scoring)
    stop = {"flag": False}

    def on_signal(_sig: int, _frame: object) -> None:
        stop["flag"] = True  # finish the current job, then exit

    signal.signal(signal.SIGTERM, on_signal)
    print(f"worker {config.name}: database {db.display_url}", file=sys.stderr)
    try:
        n = work(db.engine, config, once=args.once, drain=args.drain,
                 should_stop=lambda: stop["flag"],
                 log=lambda m: print(m, file=sys.stderr, flush=True))
    finally:
        db.close()
    print(f"worker {config.name}: {n} job(s) finished", file=sys.stderr)
    return EXIT_OK
