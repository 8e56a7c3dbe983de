"""Scoring on the CPU with Python candidates: each defense shown catching its cheat.

The cheats here pass the correctness stage (their first call on a case is honest) and
cheat only in the timed calls, so the failing verdicts come from the per-call checks of
`harness.submissions.scoring.timed_calls`: fresh inputs, poison, input snapshot, secret row oracle,
and the physical time floor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from harness.core.candidate import Candidate
from harness.core.cases import Case, MaskKind
from harness.core.reference import reference_for_case
from harness.submissions.floor import floor_ms
from harness.submissions.scoring import ScoringOptions, score_candidate
from harness.submissions.timed import check_rows, count_poison, pick_rows

CASES = [Case(1, 2, 2, 37, 53, 32, "float16", MaskKind.CAUSAL_BR),
         Case(2, 2, 1, 16, 16, 32, "bfloat16", MaskKind.RANDOM)]
PERF = [Case(1, 2, 2, 64, 64, 32, "float16", MaskKind.NONE),
        Case(1, 2, 2, 64, 64, 32, "bfloat16", MaskKind.CAUSAL_BR)]
# Generous ceilings: the floor is far below any CPU time.
CEILINGS = {"copy_gbps": 1e9, "matmul_tflops": 1e9}


def _options(**kw) -> ScoringOptions:
    base = dict(device="cpu", correctness_cases=CASES, perf_cases=PERF, min_samples=3,
                min_time_s=0.0, max_time_s=1.0, warmup_calls=1, ceilings=CEILINGS)
    base.update(kw)
    return ScoringOptions(**base)


@dataclass
class Honest(Candidate):
    """The float64 oracle rounded to the output dtype (plus an optional cheat)."""

    name: str = "honest"
    kind: str = "model"
    device: str = "cpu"
    calls: dict = field(default_factory=dict)

    def compute(self, case, inputs, out, lse) -> None:
        ref_out, ref_lse = reference_for_case(case, inputs)
        out.copy_(ref_out.to(out.dtype))
        if lse is not None:
            lse.copy_(ref_lse.to(lse.dtype))

    def run(self, case, inputs, out, lse) -> None:
        n = self.calls.get(case.id, 0)
        self.calls[case.id] = n + 1
        self.cheat(n, case, inputs, out, lse)

    def cheat(self, n, case, inputs, out, lse) -> None:
        self.compute(case, inputs, out, lse)


class StaleCache(Honest):
    """Computes once per case and replays that output (keyed by case, like a pointer- or
    shape-keyed cache)."""

    def cheat(self, n, case, inputs, out, lse) -> None:
        store = self.__dict__.setdefault("store", {})
        if case.id not in store:
            self.compute(case, inputs, out, lse)
            store[case.id] = (out.clone(), None if lse is None else lse.clone())
        else:
            out.copy_(store[case.id][0])
            if lse is not None:
                lse.copy_(store[case.id][1])


class LazyAfterFirst(Honest):
    """Does the work on the first call of a case only (an 'already computed' flag)."""

    def cheat(self, n, case, inputs, out, lse) -> None:
        if n == 0:
            self.compute(case, inputs, out, lse)


class PartialLater(Honest):
    """Later calls skip the last query row (a partial write tolerance might hide)."""

    def cheat(self, n, case, inputs, out, lse) -> None:
        keep_out, keep_lse = out[:, :, -1].clone(), None if lse is None else lse[:, :, -1].clone()
        self.compute(case, inputs, out, lse)
        if n > 0:
            out[:, :, -1] = keep_out
            if lse is not None:
                lse[:, :, -1] = keep_lse


class ScribblesInputs(Honest):
    def cheat(self, n, case, inputs, out, lse) -> None:
        self.compute(case, inputs, out, lse)
        if n > 0:
            inputs.k.view(-1)[0] += 1


class NanLater(Honest):
    def cheat(self, n, case, inputs, out, lse) -> None:
        self.compute(case, inputs, out, lse)
        if n > 0:
            out.view(-1)[-1] = float("nan")


class AlwaysPartial(Honest):
    def cheat(self, n, case, inputs, out, lse) -> None:
        self.compute(case, inputs, out, lse)
        out[:, :, :1] = 0.5


def _score(cand: Candidate, **kw):
    return score_candidate(cand, _options(**kw), secret=1234, baseline=Honest(name="base"))


def test_honest_candidate_is_scored():
    # A generous cap: on a loaded runner the default 1 s cap can end sampling after the
    # first case (a documented cut), which is not what this test is about; nor is the
    # slow-submission cut, which a scheduling stall of a few milliseconds in two of three
    # sub-millisecond CPU samples reached on a loaded 2-core CI machine.
    rep = _score(Honest(), max_time_s=30.0, slow_cut_factor=1e9)
    assert rep.verdict == "scored", rep.message
    assert rep.score is not None and rep.score > 0
    assert rep.detail["coverage"] == {"timed": 2, "of": 2, "unsupported": []}
    assert all(p["checked_calls"] >= 4 for p in rep.detail["perf"])  # warm-up + samples


@pytest.mark.parametrize("cheat,needle", [
    (StaleCache, "output wrong on sampled rows"),
    (LazyAfterFirst, "still poisoned"),
    (PartialLater, "still poisoned"),
    (ScribblesInputs, "input k was modified"),
    (NanLater, "non-finite"),
])
def test_timed_call_cheats_caught(cheat, needle):
    # One run per correctness case, so the cheats that start after their first call reach
    # the timed stage (with the default repeats the race check stops them earlier).
    rep = _score(cheat(), race_repeats=1)
    assert rep.verdict == "incorrect", rep.message
    assert needle in rep.message
    assert "timed call" in rep.message
    assert rep.score is None
    assert rep.failing_cases and rep.failing_cases[-1]["case"] == PERF[0].id


def test_correctness_failures_listed_and_stop_at_first():
    rep = _score(AlwaysPartial())
    assert rep.verdict == "incorrect"
    assert [f["case"] for f in rep.failing_cases] == [c.id for c in CASES]
    rep = _score(AlwaysPartial(), stop_at_first_failure=True)
    assert [f["case"] for f in rep.failing_cases] == [CASES[0].id]


def test_cheat_after_the_first_call_is_caught_by_the_repeats():
    rep = _score(LazyAfterFirst())
    assert rep.verdict == "incorrect" and "repeat 1" in rep.message
    assert "timed call" not in rep.message


# A datasheet with a floor of many seconds per case: any CPU time is below it.
TINY_DATASHEET = {"name": "tiny", "tflops_fp16": 1e-9, "hbm_tbps": 1e-6}


def test_time_below_physical_floor_is_invalid():
    rep = _score(Honest(), datasheet=TINY_DATASHEET)
    assert rep.verdict == "invalid"
    assert "below the physical floor" in rep.message and "tiny datasheet" in rep.message


def test_faster_than_measured_ceilings_is_scored_but_suspicious():
    tiny = {"copy_gbps": 1e-3, "matmul_tflops": 1e-9}  # measured floor of many seconds
    # No slow cut: the two equal candidates are timed from 3 CPU samples each, which a
    # loaded test machine can stretch far enough to cut a case this test needs measured.
    rep = _score(Honest(), ceilings=tiny, datasheet={"name": "big", "tflops_fp16": 1e9,
                                                     "hbm_tbps": 1e9}, slow_cut_factor=0)
    assert rep.verdict == "scored", rep.message
    assert "suspicious: 2 case(s)" in rep.message
    assert [s["case"] for s in rep.detail["suspicious"]] == [c.id for c in PERF]
    assert all(p["suspicious"] for p in rep.detail["perf"])


def test_unknown_gpu_has_no_physical_floor():
    from harness.submissions.floor import floors

    f = floors(PERF[0], ScoringOptions(), "Some Future GPU")
    assert f.physical_ms is None and "no physical floor" in f.gpu


def test_floor_formula():
    case = PERF[0]
    from harness.core.flops import attention_flops
    from harness.core.iomodel import ideal_bytes

    ceil = {"copy_gbps": 1000.0, "matmul_tflops": 1.0}
    expect = max(attention_flops(case) / 1e12, ideal_bytes(case) / 1e12) * 1e3
    assert floor_ms(case, ceil) == pytest.approx(expect)


def test_row_check_covers_fully_masked_rows():
    case = Case(2, 2, 2, 40, 30, 32, "float16", MaskKind.CAUSAL_BR)  # rows 0..9 see no key
    from harness.core.buffers import OutputBuffers
    from harness.core.cases import make_inputs

    inputs = make_inputs(case, "cpu", secret=5)
    gen = torch.Generator().manual_seed(1)
    rows = pick_rows(case, inputs, gen, 4)
    assert set(range(10)) <= set(rows.tolist())
    cand = Honest()
    bufs = OutputBuffers.allocate(case, "cpu", True)
    cand.compute(case, inputs, bufs.out, bufs.lse)
    assert check_rows(case, inputs, bufs, cand, rows) is None
    bufs.out[1, 0, 3, 0] = 0.25  # a fully masked row that is not 0
    assert "fully masked row" in check_rows(case, inputs, bufs, cand, rows)


def test_poison_counter_counts_unwritten():
    from harness.core.buffers import OutputBuffers

    case = PERF[0]
    bufs = OutputBuffers.allocate(case, "cpu", True)
    assert int(count_poison(bufs.out, bufs.lse)) == bufs.out.numel() + bufs.lse.numel()
    bufs.out.zero_()
    bufs.lse.zero_()
    assert int(count_poison(bufs.out, bufs.lse)) == 0


def test_options_round_trip():
    o = _options(max_perf_cases=1)
    assert ScoringOptions.from_dict(o.to_dict()) == o


def test_a_sanitizer_finding_is_incorrect_before_anything_is_timed():
    from harness.execution.sanitize import SanitizeReport, ToolReport

    finding = ToolReport("racecheck", "findings", 8, "racecheck: 8 errors: Race reported "
                         "between Write access in racy_rows+0x3a0 at racy_rows.cu:52")
    rep = score_candidate(Honest(), _options(), secret=3, baseline=Honest(name="base"),
                          sanitizer=lambda: SanitizeReport("findings", [finding], ["c"]))
    assert rep.verdict == "incorrect" and rep.message == finding.summary
    assert rep.detail["sanitizer"]["status"] == "findings" and "perf" not in rep.detail


class IllegalAccess(Honest):
    def cheat(self, n, case, inputs, out, lse) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_crash_is_named_by_the_sanitizer_run_afterwards(monkeypatch):
    from harness.execution.sanitize import SanitizeReport, ToolReport
    from harness.submissions import scoring

    monkeypatch.setattr(scoring, "context_usable", lambda device: False)
    finding = ToolReport("memcheck", "findings", 4, "memcheck: 4 errors: Invalid __global__ "
                         "write of size 2 bytes at far_writer.cu:97 (1,363,425 bytes after "
                         "an allocation of 32 bytes)")
    runs = []

    def sanitizer():
        runs.append(1)
        return SanitizeReport("findings", [finding], ["c"])

    rep = score_candidate(IllegalAccess(), _options(), secret=3, baseline=Honest(name="base"),
                          sanitizer=sanitizer)
    assert rep.verdict == "crashed" and len(runs) == 1
    assert "illegal memory access" in rep.message and finding.summary in rep.message
    assert rep.detail["sanitizer"]["status"] == "findings"


def test_a_sanitizer_tool_that_cannot_finish_is_not_a_clean_bill():
    from harness.execution.sanitize import SanitizeReport, ToolReport

    tools = [ToolReport("memcheck", "clean"),
             ToolReport("racecheck", "timeout", 0, "racecheck: did not finish within 50 s")]
    rep = score_candidate(Honest(), _options(), secret=3, baseline=Honest(name="base"),
                          sanitizer=lambda: SanitizeReport("failed", tools, ["c"]))
    assert rep.verdict == "incorrect" and "racecheck" in rep.message
    assert "did not finish" in rep.message and "perf" not in rep.detail


class Sleepy(Honest):
    """Right, but sleeps on every call after the first of a case (so its correctness is
    quick and its timing is very slow): the 100 ms-per-launch submission that held the
    queue for 151 s of GPU time."""

    sleep_s: float = 0.05

    def cheat(self, n, case, inputs, out, lse) -> None:
        import time

        if n:
            time.sleep(self.sleep_s)
        self.compute(case, inputs, out, lse)


class DeclaredTimer:
    """Times a call by the milliseconds it declares (`DeclaredTimer.cost_ms`, 1 ms unless
    the call sets it), not by the wall clock: the cut compares the submission's median with
    the baseline's, and on a loaded 2-core runner the wall clock has moved the baseline's
    median of a sub-millisecond CPU call past 50 ms, so that a 0.25 s call fell within 5x."""

    cost_ms = 1.0
    reference_clock_mhz = None

    def sample(self, run, check):
        DeclaredTimer.cost_ms = 1.0
        run()
        return DeclaredTimer.cost_ms, check(), True, None

    def method(self) -> str:
        return "declared cost (test)"


class DeclaredSlow(Honest):
    """Right, and 250 ms a call after the first of a case, by its declared cost."""

    def cheat(self, n, case, inputs, out, lse) -> None:
        if n:
            DeclaredTimer.cost_ms = 250.0
        self.compute(case, inputs, out, lse)


def test_a_far_slower_submission_is_cut_short_and_scored_from_what_was_measured():
    perf = PERF * 3  # six perf cases
    rep = score_candidate(DeclaredSlow(), _options(perf_cases=perf, min_samples=20,
                                                   min_time_s=0.02, slow_cut_factor=5.0),
                          secret=7, baseline=Honest(name="base"), timer=DeclaredTimer())
    assert rep.verdict == "scored" and rep.score is not None and rep.score < 0.2
    assert "timing cut short" in rep.message and "over the 5x cut" in rep.message
    assert "250x slower than base" in rep.message
    assert rep.detail["coverage"]["timed"] == 1 and rep.detail["coverage"]["of"] == 6
    [entry] = rep.detail["perf"]
    assert entry["samples"] == 3  # its sampling stopped after 3 samples, not 20
    assert entry["median_ms"] == 250.0 and entry["baseline_median_ms"] == 1.0
    assert rep.detail["gpu_budget_s"] == 600.0


def test_the_job_gpu_budget_bounds_correctness_and_timing():
    rep = score_candidate(Sleepy(), _options(gpu_budget_s=0.0), secret=7,
                          baseline=Honest(name="base"))
    assert rep.verdict == "timeout" and "over the job's GPU budget of 0 s during " \
        "correctness (0 of 2 cases checked)" in rep.message
    # a budget that correctness fits but the timing does not: scored from what was timed
    import time

    class Clock:
        t = 0.0

    clock = Clock()
    real = time.monotonic

    def fake() -> float:
        return real() + clock.t

    import harness.submissions.scoring as scoring

    calls = {"n": 0}
    orig = scoring.timed_calls

    def timed(*a, **kw):
        calls["n"] += 1
        out = orig(*a, **kw)
        clock.t += 100.0  # each timed case "takes" 100 s of the budget
        return out

    scoring.time.monotonic, scoring.timed_calls = fake, timed  # type: ignore[assignment]
    try:
        # Two equal CPU candidates: on a loaded 2-core machine one call can still come
        # out 100x slower than the other, which would trip the slow cut instead of the
        # budget this test is about; the cut is off here (its own test covers it).
        rep = score_candidate(Honest(), _options(perf_cases=PERF * 3, gpu_budget_s=250.0,
                                                 slow_cut_factor=0.0),
                              secret=7, baseline=Honest(name="base"))
    finally:
        scoring.time.monotonic, scoring.timed_calls = real, orig  # type: ignore[assignment]
    assert rep.verdict == "scored" and "GPU budget of 250 s was reached" in rep.message
    assert 0 < rep.detail["coverage"]["timed"] < 6


def test_the_leaderboard_shows_the_gpu_seconds_against_the_budget():
    from harness.submissions.ranking import gpu_seconds

    assert gpu_seconds({"elapsed_s": 71.4, "gpu_budget_s": 600.0}) == "71/600"
    assert gpu_seconds({"gpu_s": 3.2}) == "3"
    assert gpu_seconds({}) is None and gpu_seconds(None) is None
