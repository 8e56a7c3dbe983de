"""`fa-harness dashboard [--db URL] [--port N]`: serve the Streamlit dashboard headless."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.cli.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]  # the directory holding the harness package
APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "dashboard", help="serve the results dashboard (Streamlit, headless)",
        description="Serve the results dashboard. With no --db it reads the default SQLite "
                    "database (FA_HARNESS_DB overrides); `fa-harness import --trusted "
                    "results/` fills it with this project's H200 history.")
    p.add_argument("--db", metavar="URL", default=None,
                   help="SQLAlchemy URL or SQLite file path of the results database")
    p.add_argument("--port", type=int, default=8501, help="TCP port (default 8501)")
    p.add_argument("--address", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.set_defaults(func=run)


def upload_limit_mb() -> int:
    """Streamlit's `server.maxUploadSize` for the Submit page, in its unit (MiB, whole):
    a submission's total size limit, rounded up. Streamlit's own default is 200 MB, which
    it would read into the server's memory for anyone with the page open, token or not."""
    from harness.submissions.sources import MAX_TOTAL_BYTES

    return max(1, -(-MAX_TOTAL_BYTES // 2**20))


def command(args: argparse.Namespace) -> list[str]:
    """The `streamlit run` command line for these arguments (through harness.dashboard.serve, which
    imports the dashboard's libraries before the server starts answering)."""
    cmd = [sys.executable, "-m", "harness.dashboard.serve", "run", str(APP),
           "--server.headless", "true", "--server.port", str(args.port),
           "--server.address", args.address, "--browser.gatherUsageStats", "false",
           "--server.maxUploadSize", str(upload_limit_mb())]
    if args.db:
        cmd += ["--", "--db", args.db]
    return cmd


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a TCP port (1-65535)")
    if not APP.exists():
        raise UsageError(f"the dashboard app is missing: {APP}")
    import importlib.util

    if importlib.util.find_spec("streamlit") is None:
        raise UsageError("the dashboard needs Streamlit: pip install 'fa-harness[dashboard]'")
    # `python -m harness.dashboard.serve` must find the dashboard package from any directory.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if args.db:
        # Pages loaded as separate scripts (Submit) resolve the database themselves.
        env["FA_HARNESS_DB"] = args.db
    print(f"fa-harness dashboard: http://{args.address}:{args.port}/", file=sys.stderr,
          flush=True)
    sys.stdout.flush()
    # The server replaces this process rather than running as its child: SIGTERM or
    # Ctrl-C sent to `fa-harness dashboard` (by a service manager, a CI step, a shell)
    # reaches Streamlit itself, which shuts down; a parent waiting on a child would die
    # alone and leave the server serving.
    cmd = command(args)
    os.execve(cmd[0], cmd, env)
    return 0  # not reached
