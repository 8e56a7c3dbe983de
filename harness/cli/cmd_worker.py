"""`fa-harness worker`: claim queued submissions and score them, one child per job."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from harness.cli._discoveryopt import add_discovery_options
from harness.cli.console import plain
from harness.cli.errors import EXIT_FAIL, EXIT_OK, UsageError

# This host cannot score (no usable GPU at start, or jobs failed on it in a row): the
# worker stops and leaves the queue as it was; a supervisor does not restart it.
EXIT_HOST_UNFIT = 4


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker", help="score queued submissions on one GPU",
        description="Locks its GPU (one worker per GPU), claims queued submissions and "
                    "scores each in an isolated child process pinned to that GPU, with time "
                    "and memory limits. Exit 1 when another worker holds the GPU, 4 when this "
                    "host cannot score (no usable GPU; jobs are left queued). A database that "
                    "cannot be reached is waited for. The secret case seed comes from "
                    "FA_HARNESS_SECRET (else random per worker start).")
    p.add_argument("--gpu", default=None, metavar="N|UUID|all",
                   help="GPU to lock and score on: an index among the visible GPUs, a "
                        "GPU-... UUID, or `all` for one worker process per visible GPU")
    p.add_argument("--wait-for-gpu", action="store_true",
                   help="wait for the GPU when another worker holds it (default: refuse)")
    p.add_argument("--on-shared", choices=("requeue", "mark"), default="requeue",
                   help="a job scored while another process used the GPU: re-queue it "
                        "(default; marked once attempts run out) or store it marked")
    p.add_argument("--busy-wait", type=float, default=300.0, metavar="S",
                   help="claim nothing for up to S seconds while other processes use the "
                        "GPU (default 300)")
    p.add_argument("--events", metavar="FILE", help="append claims and finishes as JSON lines")
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
    p.add_argument("--host-fault-workers", type=int, default=2, metavar="N",
                   help="a job the host could not score (no GPU, a driver fault) is an "
                        "infrastructure error once N different workers failed it (default 2)")
    p.add_argument("--lease", type=float, default=None, metavar="S",
                   help="re-queue a running job whose last heartbeat is older than S by the "
                        "database's clock; more than --job-timeout (default job timeout + 600)")
    p.add_argument("--heartbeat", type=float, default=10.0, metavar="S",
                   help="renew a running job's lease every S seconds (default 10)")
    p.add_argument("--scorer", default=None, metavar="MODULE:FUNCTION",
                   help="scoring function (default: the harness's own; tests use stubs)")
    p.add_argument("--baseline", default="sdpa_flash")
    p.add_argument("--perf-grid", default="perf")
    p.add_argument("--correctness-grid", default="full")
    p.add_argument("--perf-bwd-grid", default="perf-bwd",
                   help="grid a declared backward is timed on (default perf-bwd)")
    p.add_argument("--no-backward", action="store_true",
                   help="score the forward only, even of submissions with a [backward] "
                        "(demos); their backward board entry is then not written")
    p.add_argument("--max-perf-cases", type=int, default=None)
    p.add_argument("--stop-at-first-failure", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="fewer timing samples (demos): 5 samples, at most 2 s per case")
    add_discovery_options(p)
    p.set_defaults(func=_worker, _parser=p)


def _worker(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from harness.submissions.gpulock import GpuBusy, GpuMissing
    from harness.submissions.worker import HostUnfit, WorkerConfig, work
    from harness.submissions.worker_store import first_line

    for name in ("case_timeout", "job_timeout", "heartbeat"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0")
    if args.lease is not None and args.lease <= args.job_timeout:
        # A live worker cut off from the database must keep its job: the lease outlasts it.
        raise UsageError(f"--lease ({args.lease:g} s) must exceed --job-timeout "
                         f"({args.job_timeout:g} s)")
    if args.gpu == "all":
        return _all_gpus(args)
    if args.gpu is not None:
        _check_gpu(str(args.gpu))
    scoring = {"baseline": args.baseline, "perf_grid": args.perf_grid,
               "correctness_grid": args.correctness_grid,
               "max_perf_cases": args.max_perf_cases, "quick": bool(args.quick),
               "stop_at_first_failure": args.stop_at_first_failure,
               "perf_bwd_grid": args.perf_bwd_grid, "score_backward": not args.no_backward}
    if args.quick:
        scoring.update(min_samples=5, min_time_s=0.05, max_time_s=2.0)
    config = WorkerConfig(gpu=args.gpu, case_timeout_s=args.case_timeout,
                          startup_timeout_s=args.startup_timeout,
                          job_timeout_s=args.job_timeout, memory_limit_mb=args.memory_limit_mb,
                          max_attempts=args.max_attempts, lease_s=args.lease, scoring=scoring,
                          wait_for_gpu=args.wait_for_gpu, on_shared=args.on_shared,
                          busy_wait_s=args.busy_wait, events=args.events,
                          heartbeat_s=args.heartbeat, preflight=True,
                          host_fault_workers=args.host_fault_workers)
    if args.scorer:
        config.scorer = args.scorer
    stop = {"flag": False}

    def on_signal(_sig: int, _frame: object) -> None:
        stop["flag"] = True  # finish the current job, then exit

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    db = _open(args.db, lambda: stop["flag"])
    if db is None:
        return EXIT_OK
    print(f"worker {config.name}: database {db.display_url}", file=sys.stderr)
    try:
        n = work(db.engine, config, once=args.once, drain=args.drain,
                 should_stop=lambda: stop["flag"],
                 log=lambda m: print(plain(m, lines=True), file=sys.stderr, flush=True))
    except GpuBusy as e:
        print(f"fa-harness worker: error: {e}", file=sys.stderr)
        return EXIT_FAIL
    except HostUnfit as e:
        print(f"fa-harness worker: error: this host cannot score: {e}", file=sys.stderr)
        return EXIT_HOST_UNFIT
    except GpuMissing as e:
        raise UsageError(str(e)) from None
    except SQLAlchemyError as e:
        # Not an outage (those are waited out): the queue itself is gone or broken, e.g.
        # its tables dropped. One line; a supervisor may start the worker again.
        print(f"fa-harness worker: error: the queue database failed: {first_line(e)}",
              file=sys.stderr)
        return EXIT_FAIL
    finally:
        db.close()
    print(f"worker {config.name}: {n} job(s) finished", file=sys.stderr)
    return EXIT_OK


def _open(url: str | None, stopped: Any) -> Any:
    """The queue database, waited for while it cannot be reached (None when told to stop
    first); one that does not exist is a usage error (a typo must not start an empty
    one)."""
    from harness.records.db import DatabaseError, open_db
    from harness.submissions.worker_store import retrying

    try:
        return retrying(lambda: open_db(url, create=False), what="opening the queue",
                        log=lambda m: print(f"fa-harness worker: {m}", file=sys.stderr,
                                            flush=True), should_stop=stopped)
    except DatabaseError as e:
        raise UsageError(str(e)) from None


def _check_gpu(spec: str) -> None:
    """--gpu N must name a GPU of this machine (checked before anything is opened); a UUID
    is resolved by the worker itself."""
    text = spec.strip()
    if text.startswith("-") and text[1:].isdigit():
        raise UsageError(f"--gpu must be >= 0, got {text}")
    if not text.isdigit():
        return
    try:
        from harness.measure.gpuinfo import visible_gpus

        count = len(visible_gpus())
    except Exception:  # noqa: BLE001 - no NVML library or driver: ask CUDA
        import torch

        count = torch.cuda.device_count()
    if int(text) >= count:
        raise UsageError(f"--gpu {text}: this machine has {count} GPU(s)"
                         + (f" (0..{count - 1})" if count else ""))


def _argv(args: argparse.Namespace) -> list[str]:
    """The options of this `worker` command line, rebuilt from the parsed arguments."""
    out = ["worker"]
    for a in args._parser._actions:
        if not a.option_strings or a.dest in ("help", "gpu"):
            continue
        v = getattr(args, a.dest, None)
        if isinstance(a, argparse._StoreTrueAction):
            out += [a.option_strings[0]] if v else []
        elif isinstance(a, argparse._AppendAction):  # --kernels-dir, --candidate: repeated
            for item in v or []:
                out += [a.option_strings[0], str(item)]
        elif v is not None and v != a.default:
            out += [a.option_strings[0], str(v)]
    return out


def _all_gpus(args: argparse.Namespace) -> int:
    from harness.measure.gpuinfo import visible_gpus
    from harness.submissions.fleet import launch

    try:
        gpus = visible_gpus()
    except RuntimeError as e:
        raise UsageError(f"--gpu all: {e}") from None
    if not gpus:
        raise UsageError("--gpu all: no GPU visible")
    return launch(_argv(args), gpus, log=lambda m: print(m, file=sys.stderr, flush=True))
