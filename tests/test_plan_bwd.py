"""The gate's backward (harness.runs.plan_bwd): the owned candidates that declare a
backward get it timed on a floor of cases, their own forward-timed shapes first, no
decode shapes, the baseline's backward beside them; fewer is "not measured"."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from harness.core.cases import Case, MaskKind
from harness.core.grids import get_grid
from harness.core.results import CaseResult, Status, Timing
from harness.runs import gate_run
from harness.runs.plan import Plan, make_plan
from harness.runs.plan_bwd import BWD_TIMING_MIN, backward_checked, plan_backward


@dataclass
class Cand:
    name: str
    backward: bool = False
    kind: str = "cuda"
    device: str = "cuda"
    isolate: bool = True
    meta: dict = field(default_factory=dict)

    @property
    def support(self):
        return SimpleNamespace(backward=self.backward)

    def supports(self, case: Case) -> str | None:
        return None


def test_owned_backwards_are_timed_on_their_forward_shapes_beside_the_baseline():
    mine, plain = Cand("mine", backward=True), Cand("plain")
    yard, base = Cand("yard", backward=True, kind="peer"), Cand("sdpa_flash", True, "peer")
    cands = [mine, plain, yard, base]
    timing = get_grid("perf") + get_grid("decode")
    plan = make_plan(cands, [], timing, owned=["mine", "plain"])
    before = plan.timed_s
    plan_backward(plan, cands, timing, owned=["mine", "plain"])
    assert set(plan.timed_bwd) == {"mine", "sdpa_flash"}  # no backward / a yardstick: none
    cases = plan.timed_bwd["mine"]
    assert len(cases) == BWD_TIMING_MIN == plan.minimum_bwd["mine"]
    assert all(c.seqlen_q > 16 for c in cases)  # no decode shapes
    fwd_non_decode = [c for c in plan.timed["mine"] if c.seqlen_q > 16]
    assert cases == fwd_non_decode[:BWD_TIMING_MIN]
    assert plan.timed_bwd["sdpa_flash"] == cases
    assert plan.timed_s > before  # estimated at the backward's cost
    assert "timed: mine (bwd) on 4 case(s)" in plan.lines()
    assert plan.to_dict()["minimum_bwd"] == {"mine": 4}
    assert [c.name for c in backward_checked(cands, ["mine", "plain"])] == ["mine"]


def test_no_gpu_shapes_no_backward_timing():
    mine = Cand("mine", backward=True)
    plan = make_plan([mine], [], get_grid("decode"), owned=["mine"])
    plan_backward(plan, [mine], get_grid("decode"), owned=["mine"])
    assert plan.timed_bwd == {} and plan.minimum_bwd == {}


def test_a_backward_under_its_floor_is_not_measured():
    plan = Plan(budget_s=300, min_time_s=0.2, minimum={"mine": 1}, minimum_bwd={"mine": 4})
    case = Case(1, 2, 2, 64, 64, 64, "float16", MaskKind.NONE)
    fwd = CaseResult("mine", case, Status.PASSED, timing=Timing(median_ms=1.0,
                                                                samples_ms=[1.0] * 20))
    bwd = [CaseResult("mine", Case(1, 2, 2, 64 + i, 64, 64, "float16", MaskKind.NONE),
                      Status.PASSED, timing=Timing(median_ms=2.0, samples_ms=[2.0] * 20),
                      extra={"pass": "bwd"}) for i in range(3)]
    assert gate_run.timed_count([fwd, *bwd], "mine") == 1
    assert gate_run.timed_count([fwd, *bwd], "mine", "bwd") == 3
    assert gate_run._under_floor(plan, [fwd, *bwd], []) == [
        ("mine", "backward: 3 timed case(s), fewer than its floor of 4")]
    # The forward and the backward of one case are two results, never deduplicated.
    both = gate_run._dedupe([fwd, CaseResult("mine", case, Status.PASSED,
                                             extra={"pass": "bwd"})])
    assert sorted(r.pass_name for r in both) == ["bwd", "fwd"]
