"""Cheating and broken submissions executed on a GPU: each gets its verdict, the worker
goes on (GPU only; run on the H200 with `pytest -m gpu tests/test_cheats_gpu.py`).

Every submission here passes validation (they are valid CUDA); what catches them is the
scoring run in the worker's isolated child: the correctness stage, the per-call checks of
the timed stage, or the worker's deadlines. Correctness runs on a few small cases and stops
at the first failure, and the timed stage on the smallest perf case, to keep this fast.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.core.candidate import Candidate
from harness.core.cases import Case, MaskKind
from harness.submissions import submit
from harness.submissions.queue import Job
from harness.submissions.worker import WorkerConfig, run_job

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


@pytest.fixture(autouse=True)
def _sandbox_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the verdicts of a GPU worker, not the sandbox (tested on its
    own in test_submit_hostile.py): on a GPU host without bubblewrap they accept the
    resource-limits backend, as an operator there would have to."""
    import shutil

    if shutil.which("bwrap") is None:
        monkeypatch.setenv("FA_HARNESS_SANDBOX", "rlimits")

DATA = Path(__file__).parent / "data" / "submissions"
SMALL = [Case(1, 2, 2, 37, 53, 64, "float16", MaskKind.CAUSAL_BR),
         Case(2, 4, 2, 128, 217, 64, "bfloat16", MaskKind.KEY_PADDING),
         Case(2, 4, 4, 113, 203, 128, "float16", MaskKind.RANDOM)]
PERF = [Case(32, 32, 32, 512, 512, 64, "float16", MaskKind.NONE)]

EXPECTED = {
    "good_rowwarp.cu": ("scored", ""),
    "loop_forever.cu": ("timeout", "no progress"),
    "sleeps.cu": ("timeout", "no progress"),
    "illegal_address.cu": ("crashed", ""),
    "write_past_output.cu": ("incorrect", "written after the output"),
    "nan_output.cu": ("incorrect", "non-finite"),
    "partial_output.cu": ("incorrect", "never written"),
    "modified_inputs.cu": ("incorrect", "input q was modified"),
    "cached_output.cu": ("incorrect", ""),
    # A real shared-memory race: seen by the bitwise repeats, by a wrong value or, on a
    # run where neither shows it, by racecheck before anything is timed.
    "racy_rows.cu": ("incorrect", ("nondeterministic", "racecheck", "exceeds")),
    # A write 3 MiB past O: an illegal access when that address is unmapped (then
    # memcheck names it), else a memcheck finding before timing.
    "far_writer.cu": (("crashed", "incorrect"), ("memcheck",)),
}


def _config() -> WorkerConfig:
    scoring = {"correctness_cases": [c.to_dict() for c in SMALL],
               "perf_cases": [c.to_dict() for c in PERF], "stop_at_first_failure": True,
               "min_samples": 5, "min_time_s": 0.05, "max_time_s": 2.0}
    # A hang costs one case timeout: 20 s is far above any honest case here (a compile
    # of a small kernel and a few launches); the sanitizer stage has its own allowance.
    return WorkerConfig(gpu=None, case_timeout_s=20.0, job_timeout_s=600.0,
                        scoring=scoring, secret=20251129)


@pytest.mark.parametrize("fname", sorted(EXPECTED))
def test_submission_verdict(fname):
    files = submit.pack_path(DATA / fname)
    submit.validate(files)  # every one of them is valid CUDA: runtime checks must catch it
    job = Job(id=0, name=fname, files=files, manifest=None, source_hash="", worker="t",
              attempts=1, claimed_at=None)  # type: ignore[arg-type]
    outcome = run_job(job, _config())
    verdicts, needles = EXPECTED[fname]
    verdicts = (verdicts,) if isinstance(verdicts, str) else verdicts
    needles = (needles,) if isinstance(needles, str) else needles
    assert outcome.verdict in verdicts, f"{fname}: {outcome.verdict}: {outcome.message}"
    assert any(n in outcome.message for n in needles), outcome.message
    if outcome.verdict == "scored":
        assert outcome.score and outcome.score > 0
    # A GPU left in a bad state by the previous job would fail the next test's context.
    torch.cuda.synchronize()


@dataclass
class SideStream(Candidate):
    """Test-only candidate (host code, which submissions cannot have): computes the right
    answer with the baseline, but on another stream behind a long device-side delay, so
    the timed stream's events see almost nothing of it."""

    inner: Any = None
    side: Any = None

    def run(self, case, inputs, out, lse) -> None:  # noqa: ANN001
        main = torch.cuda.current_stream()
        self.side.wait_stream(main)  # inputs and poison are in place
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(50_000_000)  # ~25 ms at 2 GHz
            self.inner.run(case, inputs, out, lse)
        # No main.wait_stream(side): the work escapes the timed stream.


def _baseline() -> Candidate:
    from harness.candidates.peers import sdpa_peers

    return next(p for p in sdpa_peers() if p.name == "sdpa_flash")


def test_side_stream_work_seen_as_unwritten():
    from harness.submissions.timed import (
        CheatDetected,
        CudaCallTimer,
        ScoringOptions,
        timed_calls,
    )

    base = _baseline()
    cand = SideStream(name="side_stream", kind="peer", device="cuda", support=base.support,
                      inner=base, side=torch.cuda.Stream())
    case = PERF[0]
    opts = ScoringOptions(min_samples=3, min_time_s=0.0, max_time_s=1.0, warmup_calls=1)
    with pytest.raises(CheatDetected, match="still poisoned"):
        timed_calls(cand, case, secret=7, timer=CudaCallTimer(), options=opts, device="cuda")


def test_honest_peer_passes_timed_checks():
    """The same checks do not flag an honest candidate (the baseline itself)."""
    from harness.submissions.timed import CudaCallTimer, ScoringOptions, timed_calls

    base = _baseline()
    opts = ScoringOptions(min_samples=5, min_time_s=0.05, max_time_s=2.0, warmup_calls=1)
    t = timed_calls(base, PERF[0], secret=7, timer=CudaCallTimer(), options=opts,
                    device="cuda")
    assert t.median_ms and t.median_ms > 0 and t.checked_calls >= 6


def test_rejected_ones_never_run():
    for fname in ("dynamic_parallelism.cu", "rdc_option.cu", "huge_grid.cu", "huge_smem.cu",
                  "system_include.cu", "syntax_error.cu", "missing_entry.cu",
                  "wrong_signature.cu"):
        with pytest.raises(submit.Rejected):
            submit.validate(submit.pack_path(DATA / fname))
    assert json.dumps(EXPECTED)  # the runtime set above is disjoint from these
    assert not set(EXPECTED) & {"dynamic_parallelism.cu", "rdc_option.cu"}


def test_a_hanging_cuda_kernel_costs_one_timeout_for_all_its_cases():
    """The isolated child with the spinning kernel: the first case times out, the rest are
    reported as not run, and the whole costs one deadline (not one per case)."""
    from harness.execution.isolate import run_isolated

    cases = SMALL[:4]
    res = run_isolated("loop_forever", cases, mode="check",
                       options={"variant_path": str(DATA / "loop_forever.cu"),
                                "device": "cuda"}, timeout_s=8.0)
    # One deadline, counted in verdicts rather than seconds (a child start with an NVRTC
    # compile takes what a loaded runner gives it): one timeout, the other cases never
    # started, so never timed.
    assert res[0].status.value == "timeout", res[0].message
    assert all(r.status.value == "skipped" and r.message ==
               f"not run: {cases[0].id} hung for 8 s" for r in res[1:]), [r.message for r in res]
