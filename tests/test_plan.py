"""The CI gate's plan: what is timed within the budget, and what is left out and why."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.core.cases import Case
from harness.core.grids import get_grid
from harness.runs import plan as P

RESULTS = Path(__file__).resolve().parents[1] / "results"


@dataclass
class Cand:
    name: str
    kind: str = "cuda"
    device: str = "cuda"
    isolate: bool = True
    meta: dict = field(default_factory=dict)
    max_seqlen: int | None = None

    def supports(self, case: Case) -> str | None:
        if self.max_seqlen and case.seqlen_k > self.max_seqlen:
            return "too long"
        return None


def test_modes_from_manifest_and_peers():
    assert P.timing_mode(Cand("x", meta={"timing": "smoke"})) == ("smoke", None)
    assert P.timing_mode(Cand("x", meta={"timing": "full", "timing_max_seqlen": 2048})) == \
        ("full", 2048)
    assert P.timing_mode(Cand("sdpa_flash", kind="peer")) == ("full", None)
    assert P.timing_mode(Cand("sdpa_cudnn", kind="peer")) == ("smoke", None)
    assert P.timing_mode(Cand("sdpa_math", kind="peer")) == ("none", None)
    assert P.timing_mode(Cand("mine")) == ("full", None)


def test_shipped_manifests_time_the_teaching_kernels_on_smoke_only():
    from harness.candidates.registry import discover

    modes = {c.name: P.timing_mode(c)[0] for c in discover() if c.kind == "cuda"}
    assert modes["fa1"] == modes["naive"] == modes["template"] == "smoke"
    assert modes["fa2_mma"] == modes["splitkv"] == "full"


def _all_accounted(p, name, cases):
    """Every timing case a candidate supports is timed or left out with a reason."""
    left = {i for lo in p.left_out if lo.kernel == name for i in lo.cases}
    timed = {c.id for c in p.timed.get(name, [])}
    assert not left & timed
    assert left | timed == {c.id for c in cases}


def test_owned_floors_come_first_and_survive_a_tiny_budget():
    timing = get_grid("perf") + get_grid("decode")
    cands = [Cand("fa2_mma"), Cand("mine"), Cand("sdpa_flash", kind="peer"),
             Cand("sdpa_cudnn", kind="peer"), Cand("fa1", meta={"timing": "smoke"})]
    p = P.make_plan(cands, get_grid("smoke"), timing, budget_min=0.1, owned=["mine", "fa1"])
    # the floors are kept whatever the budget says
    assert len(p.timed["mine"]) == P.DEFAULT_TIMING_MIN and p.minimum["mine"] == 8
    assert len(p.timed["fa1"]) == P.SMOKE_CASES and p.minimum["fa1"] == P.SMOKE_CASES
    # the baseline follows the owned cases, so their speed-up can be computed
    assert {c.id for c in p.timed["mine"]} <= {c.id for c in p.timed["sdpa_flash"]} | \
        {c.id for c in p.timed["mine"] if c.seqlen_q == 1}
    # yardsticks get nothing once the budget is gone, and say why
    assert p.timed["fa2_mma"] == [] and p.timed["sdpa_cudnn"] == []
    assert "fa2_mma" not in p.minimum
    reasons = {lo.kernel: lo.reason for lo in p.left_out}
    assert "budget" in reasons["fa2_mma"] and "budget" in reasons["sdpa_cudnn"]
    for name in ("mine", "fa2_mma", "sdpa_cudnn"):
        _all_accounted(p, name, timing)
    # and the plan's first line says why its estimate is past the budget
    assert p.estimate_s > p.budget_s
    assert p.lines()[1] == "plan: over the budget: the owned candidates' floors are never cut"
    assert max(len(line) for line in p.lines()[:2]) <= 80  # read in a CI log
    roomy = P.make_plan(cands, get_grid("smoke"), timing, budget_min=30, owned=["mine"])
    assert not any("over the budget" in line for line in roomy.lines())


def test_owned_candidates_fill_to_their_target_and_yardsticks_take_a_few():
    timing = get_grid("perf") + get_grid("decode")
    cands = [Cand("fa2_mma"), Cand("mine"), Cand("sdpa_flash", kind="peer"),
             Cand("sdpa_math", kind="peer"), Cand("capped", meta={"timing": "full",
                                                                  "timing_max_seqlen": 2048})]
    p = P.make_plan(cands, get_grid("smoke"), timing, budget_min=30, owned=["mine", "capped"])
    assert len(p.timed["mine"]) == P.DEFAULT_TIMING_CASES
    assert len(p.timed["fa2_mma"]) == P.YARDSTICK_CASES
    assert "sdpa_math" not in p.timed
    assert all(max(c.seqlen_q, c.seqlen_k) <= 2048 for c in p.timed["capped"])
    reasons = {(lo.kernel, lo.reason.split(":")[0].split(" (")[0]) for lo in p.left_out}
    assert ("mine", "timing_cases = 16 reached") in reasons
    assert ("fa2_mma", "yardstick") in reasons
    assert ("sdpa_math", "timing = none") in reasons
    assert ("capped", "timing_max_seqlen = 2048") in reasons
    for name in ("mine", "fa2_mma", "capped"):
        _all_accounted(p, name, timing)
    # a yardstick takes its cheapest cases; an owned candidate the spread of the grid
    cost = {c.id: P.timed_case_cost_s("fa2_mma", c) for c in timing}
    cut = [i for lo in p.left_out if lo.kernel == "fa2_mma" for i in lo.cases]
    assert max(cost[c.id] for c in p.timed["fa2_mma"]) <= min(cost[i] for i in cut)
    mine = p.timed["mine"]
    assert {c.head_dim for c in mine[:8]} == {64, 128}
    assert {c.dtype for c in mine[:8]} == {"float16", "bfloat16"}
    assert any(c.seqlen_q == 1 for c in mine[:8]) and any(c.mask.is_causal for c in mine[:8])
    assert p.wanted["mine"] == mine  # what the warm-up compiles, in timing order
    d = p.to_dict()
    assert json.loads(json.dumps(d)) == d and d["budget_s"] == 1800
    assert d["minimum"] == {"mine": 8, "capped": 8}


def test_manifest_and_project_settings_move_the_floor_and_the_target():
    timing = get_grid("perf")
    cands = [Cand("a", meta={"timing_min": 3, "timing_cases": 5}), Cand("b")]
    p = P.make_plan(cands, [], timing, budget_min=30, owned=["a", "b"], timing_min=2,
                    timing_target=4)
    assert p.minimum == {"a": 3, "b": 2}
    assert len(p.timed["a"]) == 5 and len(p.timed["b"]) == 4
    # a floor above what a candidate supports is what it supports
    few = [Cand("c", max_seqlen=1024)]
    p = P.make_plan(few, [], timing, budget_min=30, owned=["c"], timing_min=40)
    assert p.minimum["c"] == len(p.timed["c"]) == sum(c.seqlen_k <= 1024 for c in timing)


def test_spread_order_covers_the_grid_kinds_first_and_is_deterministic():
    timing = get_grid("perf") + get_grid("decode")
    order = P.spread_order(timing)
    assert sorted(c.id for c in order) == sorted(c.id for c in timing)
    assert P.spread_order(list(reversed(timing))) == order
    first = order[:8]
    assert {c.head_dim for c in first} == {64, 128}
    assert {str(c.mask) for c in first} >= {"none", "causal_br"}
    assert {c.dtype for c in first} == {"float16", "bfloat16"}
    assert any(c.seqlen_q == 1 for c in first) and any(c.seqlen_q > 1 for c in first)
    # the middle of each stratum first, not its smallest shape
    assert order[0].seqlen_q not in (512, 16384)


def test_no_gpu_times_nothing():
    cands = [Cand("fa2_mma"), Cand("fa1", meta={"timing": "smoke"})]
    p = P.make_plan(cands, get_grid("smoke"), get_grid("perf"), gpu=False, owned=["fa2_mma"])
    assert p.timed == {} and p.left_out == [] and p.minimum == {}


def test_default_gate_plan_of_the_shipped_candidates_as_the_project_own_them():
    from harness.candidates.registry import discover, owned

    cands = discover()
    mine = [c.name for c in cands if owned(c)]  # run from this source tree: the project's
    assert {"fa2_mma", "splitkv", "fa1"} <= set(mine)
    assert not {"sdpa_flash", "sdpa_cudnn"} & set(mine)
    p = P.make_plan(cands, get_grid("smoke"), get_grid("perf") + get_grid("decode"),
                    owned=mine, parallel=16)
    assert p.estimate_s <= 5 * 60 * P.PLAN_FILL
    assert len(p.timed["fa2_mma"]) >= P.DEFAULT_TIMING_MIN
    assert len(p.timed["splitkv"]) >= P.DEFAULT_TIMING_MIN


@pytest.mark.parametrize("name", ["fa2_mma", "sdpa_flash", "sdpa_cudnn", "fa2_simt"])
def test_rates_agree_with_the_committed_h200_record(name):
    rec = json.loads((RESULTS / "h200-20261129T201729Z-perf.json").read_text())
    rates = [e["tflops"] for e in rec["results"] if e["kernel"] == name and e.get("tflops")]
    assert abs(P.RATE_TFLOPS[name] / statistics.median(rates) - 1) < 0.05


def test_cost_estimate_matches_the_committed_perf_run_wall_time():
    """run 4 of results/notes/2026-11-29.md: 4 candidates x 48 perf cases, --min-time 0.2, 187 s."""
    perf = get_grid("perf")
    est = sum(P.timed_case_cost_s(k, c) for k in ("fa2_mma", "fa2_simt", "sdpa_flash",
                                                  "sdpa_cudnn") for c in perf)
    est += 4 * P.CHILD_START_S
    assert 0.75 * 187 <= est <= 1.5 * 187, est


def test_replan_shares_what_correctness_really_left_and_keeps_the_floors():
    timing = get_grid("perf")
    cands = [Cand("fa2_mma"), Cand("sdpa_flash", kind="peer"), Cand("fa1", meta={"timing": "smoke"}),
             Cand("sdpa_cudnn", kind="peer")]
    kw = {"owned": ["fa2_mma", "fa1"]}
    first = P.make_plan(cands, get_grid("smoke"), timing, budget_min=5.0, **kw)
    assert len(first.timed["fa2_mma"]) == P.DEFAULT_TIMING_CASES
    # correctness took far longer than estimated: 270 of the 300 s are gone
    again = P.replan(first, cands, timing, spent_s=270.0, **kw)
    assert again.correctness_took_s == 270.0 and again.correctness_s == first.correctness_s
    assert len(again.timed["fa2_mma"]) == P.DEFAULT_TIMING_MIN  # the floor, not nothing
    assert len(again.timed["fa1"]) == P.SMOKE_CASES
    assert again.timed["sdpa_cudnn"] == []
    assert again.wanted == first.wanted
    reasons = {(lo.kernel, lo.reason.split(":")[0]) for lo in again.left_out}
    assert ("fa1", "timing = smoke") in reasons
    assert any(lo.kernel == "fa2_mma" and "budget" in lo.reason for lo in again.left_out)
    assert again.to_dict()["correctness_took_s"] == 270.0
    # correctness that took less than estimated gives the time back
    early = P.replan(first, cands, timing, spent_s=5.0, **kw)
    assert len(early.timed["fa2_mma"]) == P.DEFAULT_TIMING_CASES
    assert len(early.timed["sdpa_cudnn"]) == P.YARDSTICK_CASES
