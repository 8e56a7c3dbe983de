"""`fa-harness worker --gpu all`: one worker process per visible GPU, all on one queue.

Each worker is an ordinary `fa-harness worker --gpu <UUID>` process, so each locks its
own GPU (harness.submissions.gpulock), pins its scoring children to it and claims from the
same database as the others; the queue's claims keep them from taking one job twice. The
launcher only starts them, passes SIGTERM / SIGINT on (each finishes its current job,
then exits) and returns the worst exit code.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
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


def launch(argv: Sequence[str], gpus: Sequence[VisibleGpu], *,
           log: Callable[[str], None] = lambda _m: None,
           popen: Callable[..., Any] = subprocess.Popen) -> int:
    """Run one worker per GPU until all have exited; the worst exit code."""
    procs = []
    for g in gpus:
        cmd = [sys.executable, "-m", "harness", *worker_argv(argv, g.uuid)]
        procs.append((g, popen(cmd, stdin=subprocess.DEVNULL)))
        log(f"worker for GPU {g.index} ({g.name}, {g.uuid}): pid {procs[-1][1].pid}")

    def forward(sig: int, _frame: object) -> None:
        for _, p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(sig)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        codes = [p.wait() for _, p in procs]
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    for (g, _), c in zip(procs, codes, strict=True):
        log(f"worker for GPU {g.index}: exit code {c}")
    return max((1 if c < 0 else c for c in codes), default=0)  # a signal death is 1
