"""The worker's scoring child: `python -m harness.submissions.worker --child JOB` runs
`child_main`, which scores the job's files, reports its progress (stage, case) to the
file the parent's watchdog reads, writes the result and exits hard. Kept apart from the
parent's loop (harness.submissions.worker) because it is the only part that imports torch
and touches the GPU."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_SCORER = "harness.submissions.scoring:score_files"


def _resolve(path: str) -> Callable[..., Any]:
    mod, _, attr = path.partition(":")
    return getattr(importlib.import_module(mod), attr)


def child_main(job_path: str) -> int:
    """Run inside the child: score the job's files, write the result, exit hard."""
    doc = json.loads(Path(job_path).read_text())
    Path(job_path).unlink(missing_ok=True)  # the secret does not stay on disk
    progress_path = Path(doc["progress"])
    result_path = Path(doc["result"])
    state = {"stage": "start", "case": ""}
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
        report = scorer(doc["files"], options, secret=int(doc["secret"]), progress=progress)
        if not isinstance(report, ScoreReport):
            raise TypeError(f"scorer returned {type(report).__name__}, not ScoreReport")
        out = report.to_dict()
    except Exception as e:  # noqa: BLE001 - any error of the scoring run is the verdict
        where = f"{state['stage']} {state['case']}".strip()
        text = str(e).strip().splitlines()[0][:1000] if str(e).strip() else ""
        out = ScoreReport("crashed", f"{type(e).__name__} during {where}: {text}").to_dict()
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, default=str))
    tmp.replace(result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter and CUDA teardown: after a kernel fault it can hang or abort.
    os._exit(0)
