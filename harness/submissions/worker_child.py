"""The worker's scoring child: `python -m harness.submissions.worker --child JOB` runs
`child_main`, which scores the job's files, reports its progress (stage, case) to the
file the parent's watchdog reads, writes the result and exits hard. Before every stage
and case and before writing any result it asks its worker whether the job's lease is
still held (harness.submissions.lease): told no, it exits at once, scoring nothing more. Kept apart from the
parent's loop (harness.submissions.worker) because it is the only part that imports torch
and touches the GPU. `--probe SCORER` runs `probe_main`: can this host score at all?"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.submissions.lease import ABANDONED, ask_gate
from harness.submissions.queue import Outcome

DEFAULT_SCORER = "harness.submissions.score_job:score_files"
# Marks a result file written before the backward ran: the forward's verdict, final, and
# a backward still to come. A child that dies or is killed after writing it has its
# forward stored as scored and the death blamed on the backward alone.
PENDING = "backward_pending"


def _resolve(path: str) -> Callable[..., Any]:
    mod, _, attr = path.partition(":")
    return getattr(importlib.import_module(mod), attr)


def _write(result_path: Path, doc: dict[str, Any]) -> None:
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, default=str))
    tmp.replace(result_path)  # atomic: the parent never reads half a file


def read_result(result_path: Path) -> tuple[Outcome | None, bool]:
    """(the outcome in the child's result file, whether its backward was still pending);
    (None, False) without a file. ValueError, KeyError or TypeError when it is unreadable."""
    if not result_path.is_file():
        return None, False
    doc = json.loads(result_path.read_text())
    return Outcome.from_dict(doc), bool(doc.get(PENDING))


def with_forward(result_path: Path, failure: Outcome) -> Outcome:
    """What to store for a child that was killed or died: `failure`, unless it had written
    its forward's verdict before the backward ran; then that verdict, with `failure` as
    the backward's outcome (the forward's score is not erased by its backward)."""
    try:
        forward, pending = read_result(result_path)
    except (ValueError, KeyError, TypeError):
        return failure
    if forward is None or not pending:
        return failure
    forward.detail["elapsed_s"] = failure.detail.get("elapsed_s")
    failure.message = f"backward: {failure.message}"
    forward.backward = failure
    return forward


def child_main(job_path: str) -> int:
    """Run inside the child: score the job's files, write the result, exit hard."""
    doc = json.loads(Path(job_path).read_text())
    Path(job_path).unlink(missing_ok=True)  # the secret does not stay on disk
    progress_path = Path(doc["progress"])
    result_path = Path(doc["result"])
    gate = doc.get("gate")
    state = {"stage": "start", "case": ""}

    def go_on() -> None:
        """The worker's leave to go on; without it (its lease lost, the worker gone)
        the child stops here: nothing more of the job runs, no result is written."""
        if not ask_gate(gate):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(ABANDONED)
    # The sanitizer stage runs its tools for up to their own timeout without a progress
    # line: it announces that allowance (plus the tools' start-up), so the watchdog's
    # case timeout does not cut it short.
    sanitize_allow_s: list[float] = []

    def progress(stage: str, case: str) -> None:
        state["stage"], state["case"] = stage, case
        line: dict[str, Any] = {"stage": stage, "case": case, "t": time.time()}
        if stage == "sanitize" and sanitize_allow_s:
            line["allow_s"] = sanitize_allow_s[0]
        with open(progress_path, "a") as f:
            f.write(json.dumps(line) + "\n")
        go_on()

    # torch and the scorer are imported before the first progress line: until then the
    # watchdog allows the (larger) start-up time, after it only a case's.
    import torch

    from harness.submissions.scoring import ScoreReport, ScoringOptions

    try:
        frac = doc.get("gpu_memory_fraction")
        if frac and torch.cuda.is_available():
            torch.cuda.set_per_process_memory_fraction(float(frac))
        scorer = _resolve(doc.get("scorer") or DEFAULT_SCORER)
        options = ScoringOptions.from_dict(doc.get("options") or {})
        sanitize_allow_s.append(options.sanitize_timeout_s + 30.0)
        # The first progress line ends the startup allowance: importing torch, the scorer
        # module and opening the CUDA context above are start-up, however long a loaded
        # machine takes (a line written before them would leave them only a case's time).
        progress("load", "")
        kw: dict[str, Any] = {}
        if "checkpoint" in inspect.signature(scorer).parameters:
            def checkpoint(forward: ScoreReport) -> None:
                go_on()
                _write(result_path, {**forward.to_dict(), PENDING: True})

            kw["checkpoint"] = checkpoint
        report = scorer(doc["files"], options, secret=int(doc["secret"]), progress=progress,
                        **kw)
        if not isinstance(report, ScoreReport):
            raise TypeError(f"scorer returned {type(report).__name__}, not ScoreReport")
        out = report.to_dict()
    except Exception as e:  # noqa: BLE001 - any error of the scoring run is the verdict
        where = f"{state['stage']} {state['case']}".strip()
        text = str(e).strip().splitlines()[0][:1000] if str(e).strip() else ""
        # Before the first progress line nothing of the submission has run: the scorer
        # itself could not start here, the host's failure ("error"), not a verdict.
        crash = ScoreReport("crashed", f"{type(e).__name__} during {where}: {text}",
                            status="error" if state["stage"] == "start" else "done")
        # Past the forward's checkpoint, the error is the backward's.
        out = with_forward(result_path, crash).to_dict()
    go_on()  # a result only under the lease
    _write(result_path, out)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter and CUDA teardown: after a kernel fault it can hang or abort.
    os._exit(0)


def cuda_probe() -> str | None:
    """The default scorer's host check: a CUDA GPU is visible and runs a kernel. None
    when it does, else why not (one line)."""
    import torch

    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={seen})" if seen is not None else ""
    try:
        if not torch.cuda.is_available():
            return f"no usable CUDA GPU on this host{where}"
        x = torch.ones(8, device="cuda")
        if float((x + x).sum().item()) != 16.0:
            return f"the GPU{where} computed a wrong sum"
    except Exception as e:  # noqa: BLE001 - any failure to run a kernel says the same
        text = (str(e).strip().splitlines() or [""])[0][:300]
        return f"the GPU{where} does not run a kernel: {type(e).__name__}: {text}"
    return None


def probe_main(scorer: str) -> int:
    """In a child with the scoring environment: the scorer module's `probe()` (the
    default scorer's: `cuda_probe`); prints why the host cannot score and exits 1, or 0."""
    module = importlib.import_module((scorer or DEFAULT_SCORER).partition(":")[0])
    probe = getattr(module, "probe", None)
    if probe is None and (scorer or DEFAULT_SCORER) == DEFAULT_SCORER:
        probe = cuda_probe
    why = probe() if callable(probe) else None
    if why:
        print(why, flush=True)
        return 1
    return 0
