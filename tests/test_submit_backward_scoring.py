"""A submission's backward scored on its own, on the CPU with Python candidates: right
backwards scored, wrong ones (dK not summed over a GQA group, right only on the first call
of a case, unwritten after the first call) failing while the forward keeps its score, and
the sampled gradient oracle of the per-call checks against the full one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from harness.core.candidate import Candidate, Support
from harness.core.cases import Case, MaskKind, make_grad_output, make_inputs
from harness.core.reference import reference_for_case
from harness.core.reference_grad import attention_grad_naive, grad_reference_for_case
from harness.submissions.grad_sample import check_sampled, pick_keys, sampled_grads
from harness.submissions.scoring import ScoringOptions
from harness.submissions.scoring_bwd import score_passes
from harness.submissions.timed import pick_rows

# GQA (4 query heads on 2 K/V heads) in the correctness and the timed cases: a dK or dV
# not summed over its group is wrong on both.
CASES = [Case(1, 4, 2, 24, 40, 32, "float16", MaskKind.CAUSAL_BR),
         Case(2, 2, 1, 16, 16, 32, "bfloat16", MaskKind.RANDOM)]
PERF = [Case(1, 2, 2, 64, 64, 32, "float16", MaskKind.NONE),
        Case(1, 4, 2, 48, 64, 32, "bfloat16", MaskKind.CAUSAL_BR)]
PERF_BWD = [Case(1, 2, 2, 64, 64, 32, "float16", MaskKind.NONE),
            Case(1, 4, 2, 48, 64, 32, "bfloat16", MaskKind.CAUSAL_BR)]
CEILINGS = {"copy_gbps": 1e9, "matmul_tflops": 1e9}


def options(**kw) -> ScoringOptions:
    base = dict(device="cpu", correctness_cases=CASES, perf_cases=PERF,
                perf_bwd_cases=PERF_BWD, min_samples=3, min_time_s=0.0, max_time_s=1.0,
                warmup_calls=1, ceilings=CEILINGS, slow_cut_factor=0.0)
    base.update(kw)
    return ScoringOptions(**base)


@dataclass
class Exact(Candidate):
    """Forward and backward: the float64 oracles rounded to the case dtype; `bad_bwd`
    names how the backward goes wrong."""

    name: str = "exact"
    kind: str = "model"
    device: str = "cpu"
    support: Support = field(default_factory=lambda: Support(
        backward=True, backward_deterministic=True))
    bad_bwd: str = ""
    calls: dict = field(default_factory=dict)

    def run(self, case, inputs, out, lse) -> None:
        ref_out, ref_lse = reference_for_case(case, inputs)
        out.copy_(ref_out.to(out.dtype))
        if lse is not None:
            lse.copy_(ref_lse.to(lse.dtype))

    def run_backward(self, case, inputs, dq, dk, dv) -> None:
        n = self.calls.get(case.id, 0)
        self.calls[case.id] = n + 1
        store = self.__dict__.setdefault("store", {})
        if self.bad_bwd == "lazy" and n > 0:
            return  # "already computed": nothing written after the first call
        if self.bad_bwd == "first_call_only" and case.id in store:
            for buf, got in zip((dq, dk, dv), store[case.id], strict=True):
                buf.copy_(got)  # the first call's answer, replayed on new inputs
            return
        if self.bad_bwd == "no_group_sum":
            grads = _per_head_first_of_group(case, inputs)
        else:
            grads = grad_reference_for_case(case, inputs, inputs.dout)
        for buf, got in zip((dq, dk, dv), grads, strict=True):
            buf.copy_(got.to(buf.dtype))
        store[case.id] = tuple(b.clone() for b in (dq, dk, dv))


def _per_head_first_of_group(case, inputs):
    """dK of each K/V head taken from the first query head of its group only (not summed
    over the group); dQ and dV right."""
    from harness.core.reference import case_flags
    from harness.core.reference_grad import attention_grad_ref

    group = case.heads // case.kv_heads
    k = inputs.k.repeat_interleave(group, dim=1)
    v = inputs.v.repeat_interleave(group, dim=1)
    dq, dk_heads, _ = attention_grad_ref(inputs.q, k, v, inputs.dout,
                                         **case_flags(case, inputs))
    _, _, dv = grad_reference_for_case(case, inputs, inputs.dout)
    return dq, dk_heads[:, ::group], dv


def _score(cand: Candidate, **kw):
    return score_passes(cand, options(**kw), secret=99, baseline=Exact(name="base"))


def test_a_right_backward_is_scored_on_its_own():
    rep = _score(Exact())
    assert rep.verdict == "scored", rep.message
    b = rep.backward
    assert b is not None and b.verdict == "scored", b.message
    assert b.score is not None and b.score > 0
    assert "perf-bwd cases" in b.message and "backward" in b.message
    assert b.detail["pass"] == "bwd"
    assert b.detail["coverage"] == {"timed": 2, "of": 2, "unsupported": []}
    assert b.detail["correctness"]["passed"] == len(CASES)
    # every timed call was checked: the warm-up call and each sample
    assert all(p["checked_calls"] >= 4 for p in b.detail["perf"])
    # the forward's report is the forward's alone
    assert "pass" not in rep.detail and rep.detail["coverage"]["of"] == len(PERF)


def test_a_forward_only_submission_has_no_backward_entry():
    cand = Exact(support=Support())
    rep = _score(cand)
    assert rep.verdict == "scored" and rep.backward is None


@pytest.mark.parametrize("bad,race_repeats,needle,where", [
    # dK of one query head per group: wrong at the GQA correctness case already
    ("no_group_sum", 3, "dk", "correctness"),
    # right on the first call of a case (the repeats see the same inputs, so they pass):
    # the timed calls' fresh inputs and sampled oracle catch the replay
    ("first_call_only", 3, "gradients wrong on sampled rows and keys", "timed"),
    # nothing written after the first call: the repeats see the poison ...
    ("lazy", 3, "repeat 1", "correctness"),
    # ... also without race repeats: the backward check calls every case at least twice
    ("lazy", 1, "repeat 1", "correctness"),
])
def test_a_wrong_backward_fails_and_the_forward_keeps_its_score(bad, race_repeats,
                                                                  needle, where):
    rep = _score(Exact(bad_bwd=bad), race_repeats=race_repeats)
    assert rep.verdict == "scored" and rep.score is not None, rep.message
    b = rep.backward
    assert b is not None and b.verdict == "incorrect", b.message
    assert needle in b.message and b.score is None
    if where == "timed":
        assert "timed backward call" in b.message
        assert b.failing_cases[-1]["case"] == PERF_BWD[0].id
    else:
        assert "backward correctness case(s) failed" in b.message
        assert "perf" not in b.detail


def test_a_group_sum_missed_only_in_timing_is_caught_by_the_sampled_oracle():
    """Correctness on MHA cases only: the GQA bug reaches the timed calls, whose sampled
    dK rows are checked against the float64 oracle (summed over the group)."""
    mha = [Case(1, 2, 2, 16, 16, 32, "float16", MaskKind.NONE)]
    rep = _score(Exact(bad_bwd="no_group_sum"), correctness_cases=mha)
    b = rep.backward
    assert rep.verdict == "scored" and b.verdict == "incorrect", b.message
    assert "timed backward call" in b.message and "dk" in b.message
    assert b.failing_cases[-1]["case"] == PERF_BWD[1].id  # the GQA one, after the MHA one
    assert [p["case"] for p in b.detail["perf"]] == [PERF_BWD[0].id]


def test_a_backward_that_raises_is_its_own_crash():
    class Raises(Exact):
        def run_backward(self, case, inputs, dq, dk, dv) -> None:
            raise RuntimeError("boom")

    rep = _score(Raises())
    assert rep.verdict == "scored"
    b = rep.backward
    assert b.verdict == "incorrect" and "RuntimeError: boom" in b.message
    # the raising frame is named by its file alone: no folder of this machine
    assert "test_submit_backward_scoring.py:" in b.message
    here = str(Path(__file__).resolve().parent)
    assert here not in b.message and all(here not in f["message"] for f in b.failing_cases)


def test_checkpoint_gets_the_forward_before_the_backward_runs():
    seen = []

    class Watches(Exact):
        def run_backward(self, case, inputs, dq, dk, dv) -> None:
            seen.append(len(checkpoints))
            super().run_backward(case, inputs, dq, dk, dv)

    checkpoints = []
    rep = score_passes(Watches(), options(), secret=1, baseline=Exact(name="base"),
                       checkpoint=lambda r: checkpoints.append((r.verdict, r.backward)))
    assert checkpoints == [("scored", None)] and seen and all(n == 1 for n in seen)
    assert rep.backward is not None and rep.backward.verdict == "scored"


def test_the_backward_below_its_physical_floor_is_invalid():
    tiny = {"name": "tiny", "tflops_fp16": 1e-9, "hbm_tbps": 1e-6}
    rep = score_passes(Exact(), options(datasheet=tiny), secret=3,
                       baseline=Exact(name="base"))
    assert rep.verdict == "invalid"  # the forward, by its own floor
    assert rep.backward.verdict == "invalid" and "physical floor" in rep.backward.message


# ------------------------------------------------------------------ the sampled oracle


@pytest.mark.parametrize("case", [
    Case(2, 4, 2, 37, 53, 32, "float16", MaskKind.CAUSAL_BR),
    Case(3, 2, 1, 40, 30, 32, "bfloat16", MaskKind.KEY_PADDING),
    Case(2, 2, 2, 29, 29, 64, "float16", MaskKind.RANDOM),
])
def test_sampled_gradients_equal_the_full_oracle_there(case):
    inputs = make_inputs(case, "cpu", secret=4)
    dout = make_grad_output(case, "cpu", secret=4)
    out64, lse64 = reference_for_case(case, inputs)
    gen = torch.Generator().manual_seed(2)
    rows, keys = pick_rows(case, inputs, gen, 5), pick_keys(case, inputs, gen, 5)
    full = grad_reference_for_case(case, inputs, dout)
    got = sampled_grads(case, inputs, dout, out64, lse64, rows, keys, exact=True)
    torch.testing.assert_close(got[0], full[0][:, :, rows], rtol=0, atol=1e-10)
    torch.testing.assert_close(got[1], full[1][:, :, keys], rtol=0, atol=1e-10)
    torch.testing.assert_close(got[2], full[2][:, :, keys], rtol=0, atol=1e-10)
    # the yardstick: within a few roundings of the full naive backward
    from harness.core.reference import case_flags

    naive = attention_grad_naive(inputs.q, inputs.k, inputs.v, dout,
                                 **case_flags(case, inputs))
    base = sampled_grads(case, inputs, dout, out64.to(case.torch_dtype), lse64.float(),
                         rows, keys, exact=False)
    for a, b, idx in zip(base, naive, (rows, keys, keys), strict=True):
        err = (a.double() - b.index_select(2, idx).double()).abs().max()
        assert err <= 4 * (b.double() - 0).abs().max() * 2 ** -8


def test_the_sample_sees_fully_masked_rows_and_unseen_keys():
    case = Case(3, 2, 1, 40, 30, 32, "float16", MaskKind.KEY_PADDING)  # last batch: no key
    inputs = make_inputs(case, "cpu", secret=4)
    gen = torch.Generator().manual_seed(2)
    keys = pick_keys(case, inputs, gen, 3)
    lengths = inputs.key_lengths.tolist()
    assert set(range(min(lengths), case.seqlen_k)) <= set(keys.tolist())
    dout = make_grad_output(case, "cpu", secret=4)
    out64, lse64 = reference_for_case(case, inputs)
    rows = pick_rows(case, inputs, gen, 3)
    grads = tuple(g.to(case.torch_dtype)
                  for g in grad_reference_for_case(case, inputs, dout))
    args = (case, inputs, dout, out64.to(case.torch_dtype), lse64.float(), out64, lse64)
    assert check_sampled(*args, grads, rows, keys) is None
    dk = grads[1].clone()
    dk[2, 0, keys[-1]] = 0.5  # batch 2 has no valid key: its dK is 0 everywhere
    msg = check_sampled(*args, (grads[0], dk, grads[2]), rows, keys)
    assert msg is not None and "dk" in msg


class PreparedBaseline(Exact):
    """An autograd-style baseline: the work (here a 50 ms stand-in for its forward) in
    the preparation, the call itself cheap."""

    def backward_timed_call(self, case, inputs):
        import time

        time.sleep(0.05)
        grads = tuple(g.to(case.torch_dtype)
                      for g in grad_reference_for_case(case, inputs, inputs.dout))
        return lambda: grads


def test_a_baselines_prepared_forward_is_not_timed_and_its_gradients_are_checked():
    from harness.submissions.timed import HostCallTimer
    from harness.submissions.timed_bwd import timed_backward_calls

    # 3 s, not the 1 s of the other tests: each call prepares for 50 ms plus a float64
    # reference, and on a loaded runner (pytest -n 8 on 16 cores) 1 s held 3 calls.
    t = timed_backward_calls(PreparedBaseline(), PERF_BWD[0], secret=5, timer=HostCallTimer(),
                             options=options(max_time_s=3.0), device="cpu")
    assert t.checked_calls >= 4 and t.median_ms is not None and t.median_ms < 40

    class WrongPrepared(PreparedBaseline):
        def backward_timed_call(self, case, inputs):
            call = super().backward_timed_call(case, inputs)
            return lambda: tuple(g * 2 for g in call())

    from harness.submissions.timed import CheatDetected

    with pytest.raises(CheatDetected, match="gradients wrong on sampled rows and keys"):
        timed_backward_calls(WrongPrepared(), PERF_BWD[0], secret=5, timer=HostCallTimer(),
                             options=options(), device="cpu")


@pytest.mark.parametrize("status, verdict", [("CRASHED", "crashed"), ("TIMEOUT", "timeout"),
                                             ("FAILED", "incorrect")])
def test_both_passes_share_one_correctness_stage(status, verdict):
    """A backward case that crashes or hangs ends scoring as `crashed` / `timeout`, as the
    forward's does (one stage, harness.submissions.scoring.check_cases), not as a wrong
    answer; the messages name the pass."""
    from harness.core.results import CaseResult, Status
    from harness.submissions.scoring import check_cases
    from harness.submissions.timed import ScoringOptions

    case = Case(1, 2, 2, 64, 64, 32, "float16", MaskKind.NONE)
    detail: dict = {}
    rep = check_cases([case, case], lambda c: CaseResult("v", c, Status[status], "boom"),
                      options=ScoringOptions(device="cpu"), detail=detail,
                      progress=lambda *_: None, over_budget=lambda: False,
                      stage="check-bwd", what="backward ", who="the backward")
    assert rep is not None and rep.verdict == verdict, rep
    assert rep.failing_cases and rep.failing_cases[0]["case"] == case.id
    if verdict == "incorrect":
        assert rep.message.startswith("2 backward correctness case(s) failed")
    ok = check_cases([case], lambda c: CaseResult("v", c, Status.PASSED),
                     options=ScoringOptions(device="cpu"), detail=detail,
                     progress=lambda *_: None, over_budget=lambda: False,
                     stage="check", what="", who="the submission")
    assert ok is None and detail["correctness"]["passed"] == 1
