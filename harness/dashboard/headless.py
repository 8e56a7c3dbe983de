"""Serve the dashboard and look at it with a real headless Chromium.

Used by the browser test and the speed benchmark. A Streamlit page is drawn over a
websocket after the document has loaded, so Chromium's one-shot `--screenshot` captures
only the loading skeleton; instead this drives Chromium through the DevTools protocol:
navigate, wait until a chart has been drawn (or a timeout), then capture.
"""

from __future__ import annotations

import argparse
import base64
import json
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

APP = Path(__file__).resolve().parent / "app.py"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--mute-audio")


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[Any]) -> None:
    """Terminate a child process, killing it if it has not exited within 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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
        """(current, peak) resident memory of the server process, from /proc."""
        cur = peak = 0
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
        return cur, peak


@contextmanager
def serve(db_url: str, *, port: int | None = None, timeout_s: float = 60.0,
          workdir: Path | None = None) -> Iterator[Server]:
    """`streamlit run dashboard/app.py` headless on localhost, up once /_stcore/health
    answers ok; stopped (its own process only) on exit."""
    from harness.cli.cmd_dashboard import command

    port = port or free_port()
    log = Path(tempfile.mkstemp(prefix="fa-dashboard-", suffix=".log")[1])
    # The exact command line of `fa-harness dashboard --db URL --port N`; the URL travels
    # only as an argument (not through FA_HARNESS_DB), so that path is what gets exercised.
    cmd = command(argparse.Namespace(db=db_url, port=port, address="127.0.0.1"))
    env = {k: v for k, v in os.environ.items() if k != "FA_HARNESS_DB"}
    root = str(APP.parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=workdir or root)
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
        _stop(proc)


class _Cdp:
    """A minimal DevTools protocol client over one page target."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return res.get("result", {}).get("value")


# Page state as the browser sees it: drawn charts (vega-embed renders into a canvas or an
# svg with a non-zero box), the page title, alerts, and whether Streamlit is still running.
_STATE_JS = """(() => {
  const charts = [...document.querySelectorAll('.vega-embed canvas, .vega-embed svg')]
    .filter(e => e.getBoundingClientRect().width > 50 && e.getBoundingClientRect().height > 50);
  const h1 = document.querySelector('h1');
  const running = !!document.querySelector('[data-testid="stStatusWidget"]');
  const alerts = [...document.querySelectorAll('[data-testid="stAlert"]')].map(e => e.innerText);
  const exc = document.querySelectorAll('[data-testid="stException"]').length;
  return JSON.stringify({charts: charts.length, title: h1 ? h1.innerText : null,
                         running, alerts, exceptions: exc});
})()"""


@dataclass
class Capture:
    png: bytes
    state: dict[str, Any]
    seconds: float  # navigation start to the wanted state


@contextmanager
def chromium(width: int = 1400, height: int = 1100) -> Iterator[_Cdp]:
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH")
    profile = Path(tempfile.mkdtemp(prefix="fa-chromium-"))
    proc = subprocess.Popen(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
         f"--window-size={width},{height}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        targets = json.loads(_get(f"http://127.0.0.1:{port}/json/list"))
        page = next(t for t in targets if t.get("type") == "page")
        from websockets.sync.client import connect

        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10) as ws:
            cdp = _Cdp(ws)
            cdp.call("Page.enable")
            cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                     deviceScaleFactor=1, mobile=False)
            yield cdp
    finally:
        _stop(proc)
        shutil.rmtree(profile, ignore_errors=True)


def capture(cdp: _Cdp, url: str, *, want_charts: int = 1, title: str | None = None,
            timeout_s: float = 60.0, settle_s: float = 1.0) -> Capture:
    """Open `url`, wait until `want_charts` charts are drawn and the run has finished
    (title matches, Streamlit idle), then screenshot. On timeout, captures what is there."""
    t0 = time.monotonic()
    cdp.call("Page.navigate", url=url)
    state: dict[str, Any] = {}
    reached = None
    while time.monotonic() - t0 < timeout_s:
        raw = cdp.eval(_STATE_JS)
        state = json.loads(raw) if raw else {}
        done = (state.get("charts", 0) >= want_charts and not state.get("running")
                and (title is None or state.get("title") == title))
        if done or state.get("exceptions"):
            reached = time.monotonic() - t0
            break
        time.sleep(0.1)
    time.sleep(settle_s)  # let the chart finish its draw before the capture
    shot = cdp.call("Page.captureScreenshot", format="png")
    state = json.loads(cdp.eval(_STATE_JS) or "{}")
    return Capture(base64.b64decode(shot["data"]), state,
                   reached if reached is not None else float("inf"))
