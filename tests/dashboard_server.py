"""Serve the dashboard on localhost and find a Chromium for Playwright to drive: what the
browser tests, the upload test and bench/dashboard_speed.py share. Not shipped: the
installed package has no use for a browser.

Playwright drives the system's Chromium (Debian's `chromium`, which `.ci/run` installs:
no browser download); without one, a Chromium that `playwright install chromium` placed
is used.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu"]


def find_chromium() -> str | None:
    """A Chromium executable for Playwright, or None: the system's first, else
    Playwright's own when it is installed."""
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    with sync_playwright() as p:
        path = p.chromium.executable_path
    return path if Path(path).exists() else None


def launch(playwright: Any, **kw: Any) -> Any:
    """A headless Chromium browser of `playwright` (a started sync_playwright())."""
    return playwright.chromium.launch(executable_path=find_chromium(), args=CHROMIUM_ARGS,
                                      **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - localhost only
        return r.read().decode()


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_bytes(self) -> tuple[int, int]:
        """(current, peak) resident memory of the server process. psutil gives the
        current; the peak (the kernel's high-water mark, VmHWM) only /proc has."""
        import psutil

        cur = psutil.Process(self.proc.pid).memory_info().rss
        peak = cur
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
        return cur, peak


@contextmanager
def serve(db_url: str, *, port: int | None = None, timeout_s: float = 60.0,
          workdir: Path | None = None) -> Iterator[Server]:
    """`fa-harness dashboard --db URL --port N` on localhost, up once /_stcore/health
    answers ok; stopped (its own process only) on exit."""
    from harness.cli.cmd_dashboard import command

    port = port or free_port()
    log = Path(tempfile.mkstemp(prefix="fa-dashboard-", suffix=".log")[1])
    # The exact command line of `fa-harness dashboard --db URL --port N`; the URL travels
    # only as an argument (not through FA_HARNESS_DB), so that path is what gets exercised.
    cmd = command(argparse.Namespace(db=db_url, port=port, address="127.0.0.1"))
    env = {k: v for k, v in os.environ.items() if k != "FA_HARNESS_DB"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=workdir or ROOT)
    server = Server(proc, port, log)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with {proc.returncode}:\n"
                                   + log.read_text()[-2000:])
            try:
                if _get(f"{server.base}/_stcore/health").strip() == "ok":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"streamlit did not answer /_stcore/health in {timeout_s} s")
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
