"""`fa-harness worker --gpu all`: one worker process per visible GPU, all on one queue,
kept running.

Each worker is an ordinary `fa-harness worker --gpu <UUID>` process, so each locks its
own GPU (harness.submissions.gpulock), pins its scoring children to it and claims from the
same database as the others; the queue's claims keep them from taking one job twice. The
launcher is their supervisor: a worker that dies (a signal, a traceback, any exit code
but the final ones: 0 a clean stop, 2 bad usage, 4 a host that cannot score) is started
again after a pause that doubles up to a minute while it keeps dying young. SIGTERM /
SIGINT are passed on (each finishes its current job, then exits) and end the restarts; it
returns the worst exit code.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from harness.measure.gpuinfo import VisibleGpu


def worker_argv(argv: Sequence[str], uuid: str) -> list[str]:
    """`argv` (a `fa-harness ... worker ...` command line, program name excluded) with its
    `--gpu VALUE` / `--gpu=VALUE` replaced by `--gpu uuid`."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--gpu":
            skip = True
            continue
        if a.startswith("--gpu="):
            continue
        out.append(a)
    return [*out, "--gpu", uuid]


# Exit codes after which a worker is not started again (see harness.cli.cmd_worker).
FINAL = (0, 2, 4)
# A worker that ran this long before dying starts again at once; younger deaths wait.
HEALTHY_S = 60.0


def launch(argv: Sequence[str], gpus: Sequence[VisibleGpu], *,
           log: Callable[[str], None] = lambda _m: None,
           popen: Callable[..., Any] = subprocess.Popen, restart: bool = True,
           first_pause_s: float = 1.0, max_pause_s: float = 60.0) -> int:
    """Run one worker per GPU, each started again when it dies (unless `restart` is
    off), until all have stopped; the worst exit code."""
    stop = threading.Event()
    live: dict[int, Any] = {}
    codes: dict[int, int] = {}

    def keep(i: int, g: VisibleGpu) -> None:
        cmd = [sys.executable, "-m", "harness", *worker_argv(argv, g.uuid)]
        pause = first_pause_s
        while True:
            started = time.monotonic()
            p = popen(cmd, stdin=subprocess.DEVNULL)
            live[i] = p
            log(f"worker for GPU {g.index} ({g.name}, {g.uuid}): pid {p.pid}")
            rc = p.wait()
            live.pop(i, None)
            codes[i] = rc
            if rc in FINAL or not restart or stop.is_set():
                log(f"worker for GPU {g.index}: exit code {rc}")
                return
            pause = first_pause_s if time.monotonic() - started > HEALTHY_S else pause
            log(f"worker for GPU {g.index}: exit code {rc}; starting it again in "
                f"{pause:g} s")
            if stop.wait(pause):
                return
            pause = min(max_pause_s, pause * 2)

    def forward(sig: int, _frame: object) -> None:
        stop.set()
        for p in list(live.values()):
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(sig)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    threads = [threading.Thread(target=keep, args=(i, g), daemon=True)
               for i, g in enumerate(gpus)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.5)  # short joins: the signal handler runs in this thread
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return max((1 if c < 0 else c for c in codes.values()), default=0)  # a signal death is 1
