"""The worker's watchdog and the sanitizer stage: the stage runs its tools for up to their
own timeout without a progress line and announces that allowance, so a case timeout
shorter than the sanitizer's does not turn a sanitized submission into a `timeout`. Any
other stage that goes quiet for longer than the case timeout still is one."""

from __future__ import annotations

import time

from harness.submissions.queue import Job
from harness.submissions.scoring import ScoreReport
from harness.submissions.worker import WorkerConfig, run_job

SCORER = "tests.test_worker_stage_allowance:quiet_scorer"


def quiet_scorer(files, options, *, secret, progress) -> ScoreReport:
    """Goes quiet for 4 s in the stage the job names (runs in the worker's child)."""
    progress("check", "case-1")
    progress(files["stage.txt"], "")
    time.sleep(4.0)
    return ScoreReport("scored", "fine", score=1.0)


def _run(stage: str):
    config = WorkerConfig(gpu=None, case_timeout_s=2.0, job_timeout_s=120.0, scorer=SCORER,
                          secret=1, scoring={"sanitize_timeout_s": 1.0})
    job = Job(id=0, name=stage, files={"stage.txt": stage}, manifest=None, source_hash="",
              worker="t", attempts=1, claimed_at=None)  # type: ignore[arg-type]
    return run_job(job, config)


def test_the_sanitizer_stage_gets_its_announced_allowance():
    out = _run("sanitize")  # allowance: sanitize_timeout_s + 30 s
    assert out.verdict == "scored", out.message


def test_another_quiet_stage_still_times_out():
    out = _run("perf")
    assert out.verdict == "timeout" and "no progress for 2 s" in out.message, out.message
