"""The worker's scorer (`harness.submissions.worker_child.DEFAULT_SCORER`): build a
submission from its files (CUDA source and a declarative manifest, no host code) and score
its forward (harness.submissions.scoring) and, when it declares one, its backward on its
own (harness.submissions.scoring_bwd)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness.submissions.scoring import Progress, ScoreReport, _diagnosed
from harness.submissions.scoring_bwd import score_passes
from harness.submissions.timed import ScoringOptions


def score_files(files: dict[str, str], options: ScoringOptions, *, secret: int,
                progress: Progress | None = None,
                checkpoint: Callable[[ScoreReport], None] | None = None) -> ScoreReport:
    """Build the submission from its files (CUDA source + manifest only) and score it: the
    forward, then a declared backward on its own (harness.submissions.scoring_bwd;
    `checkpoint` gets the forward's report before the backward runs)."""
    from harness.submissions.submit import Rejected, load_candidate

    if torch.device(options.device).type == "cuda" and not torch.cuda.is_available():
        return ScoreReport("crashed", "this worker has no usable CUDA GPU; the submission "
                           "was not run", status="error")
    workdir = Path(tempfile.mkdtemp(prefix="fa-score-"))
    try:
        try:
            candidate = load_candidate(files, workdir)
        except Rejected as e:
            return ScoreReport("rejected", str(e))
        from harness.execution import sanitize as san

        vpath = san.variant_path_of(candidate)
        run_sanitizer = None
        if options.sanitize and torch.device(options.device).type == "cuda":
            def run_sanitizer() -> Any:
                return san.sanitize(vpath, candidate.support, san.source_names(candidate),
                                    timeout_s=options.sanitize_timeout_s)
        last = ["", ""]

        def track(stage: str, case: str) -> None:
            last[:] = [stage, case]
            if progress is not None:
                progress(stage, case)

        try:
            return score_passes(candidate, options, secret=secret, progress=track,
                                sanitizer=run_sanitizer, variant_path=vpath,
                                checkpoint=checkpoint)
        except Exception as e:
            # A fault that surfaced outside a guarded launch (the next synchronising
            # call): the same verdict as inside one, named by the sanitizer.
            from harness.core.faults import is_cuda_fatal

            text = (str(e).strip().splitlines() or [""])[0][:1000]
            if not is_cuda_fatal(text):
                raise
            where = " ".join(x for x in last if x)
            return _diagnosed(ScoreReport("crashed", f"{type(e).__name__} during {where}: "
                                          f"{text}"), run_sanitizer, progress)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
