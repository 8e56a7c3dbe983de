"""The CI gate's plan: what is timed within the budget, and what is left out and why."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.core.cases import Case
from harness.core.grids import get_grid
from harness.records import plan as P

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


def test_plan_fits_the_budget_and_lists_what_it_left_out():
    perf = get_grid("perf")
    cands = [Cand("fa2_mma"), Cand("sdpa_flash", kind="peer"), Cand("fa1", meta={"timing": "smoke"}),
             Cand("sdpa_math", kind="peer", meta={}), Cand("capped", meta={"timing": "full",
                                                                          "timing_max_seqlen": 2048})]
    p = P.make_plan(cands, get_grid("smoke"), perf, budget_min=2.0)
    assert p.estimate_s <= 120 * P.PLAN_FILL
    assert len(p.timed["fa1"]) == P.SMOKE_CASES and "sdpa_math" not in p.timed
    assert all(max(c.seqlen_q, c.seqlen_k) <= 2048 for c in p.timed["capped"])
    reasons = {(lo.kernel, lo.reason.split(":")[0]) for lo in p.left_out}
    assert ("fa1", "timing = smoke") in reasons and ("sdpa_math", "timing = none") in reasons
    assert ("capped", "timing_max_seqlen = 2048") in reasons
    assert any(lo.kernel == "fa2_mma" and "budget" in lo.reason for lo in p.left_out)
    # cheapest first: every timed case of fa2_mma costs no more than every left-out one
    cost = {c.id: P.timed_case_cost_s("fa2_mma", c) for c in perf}
    cut = next(lo for lo in p.left_out if lo.kernel == "fa2_mma")
    assert max(cost[c.id] for c in p.timed["fa2_mma"]) <= min(cost[i] for i in cut.cases)
    # everything timed or left out, nothing lost
    for name in ("fa2_mma", "fa1", "capped"):
        left = {i for lo in p.left_out if lo.kernel == name for i in lo.cases}
        assert left | {c.id for c in p.timed[name]} == {c.id for c in perf}
    d = p.to_dict()
    assert json.loads(json.dumps(d)) == d and d["budget_s"] == 120
    # correctness and the smoke timings are never cut: a tiny budget keeps them
    tiny = P.make_plan(cands, get_grid("smoke"), perf, budget_min=0.1)
    assert len(tiny.timed["fa1"]) == P.SMOKE_CASES and tiny.timed["fa2_mma"] == []


def test_a_larger_budget_times_everything_full_and_no_gpu_times_nothing():
    cands = [Cand("fa2_mma"), Cand("fa1", meta={"timing": "smoke"})]
    p = P.make_plan(cands, [], get_grid("perf"), budget_min=60)
    assert len(p.timed["fa2_mma"]) == len(get_grid("perf"))
    assert not any("budget" in lo.reason for lo in p.left_out)
    p = P.make_plan(cands, get_grid("smoke"), get_grid("perf"), gpu=False)
    assert p.timed == {} and p.left_out == []


def test_default_gate_plan_fits_five_minutes_with_the_shipped_candidates():
    from harness.candidates.registry import discover

    p = P.make_plan(discover(), get_grid("smoke"), get_grid("perf") + get_grid("decode"))
    assert p.estimate_s <= 5 * 60 * P.PLAN_FILL
    assert p.timed.get("fa2_mma")


@pytest.mark.parametrize("name", ["fa2_mma", "sdpa_flash", "sdpa_cudnn", "fa2_simt"])
def test_rates_agree_with_the_committed_h200_record(name):
    rec = json.loads((RESULTS / "h200-20261129T201729Z-perf.json").read_text())
    rates = [e["tflops"] for e in rec["results"] if e["kernel"] == name and e.get("tflops")]
    assert abs(P.RATE_TFLOPS[name] / statistics.median(rates) - 1) < 0.05


def test_cost_estimate_matches_the_committed_perf_run_wall_time():
    """run 4 of docs/h200-runs.md: 4 candidates x 48 perf cases, --min-time 0.2, 187 s."""
    perf = get_grid("perf")
    est = sum(P.timed_case_cost_s(k, c) for k in ("fa2_mma", "fa2_simt", "sdpa_flash",
                                                  "sdpa_cudnn") for c in perf)
    est += 4 * P.CHILD_START_S
    assert 0.75 * 187 <= est <= 1.5 * 187, est


def test_replan_shares_what_correctness_really_left_and_keeps_the_reasons():
    perf = get_grid("perf")
    cands = [Cand("fa2_mma"), Cand("sdpa_flash", kind="peer"), Cand("fa1", meta={"timing": "smoke"})]
    first = P.make_plan(cands, get_grid("smoke"), perf, budget_min=5.0)
    # correctness took far longer than estimated: 200 of the 300 s are gone
    again = P.replan(first, cands, perf, spent_s=200.0)
    assert again.correctness_took_s == 200.0 and again.correctness_s == first.correctness_s
    assert again.timed_s <= (300 - 200 - P.RESERVE_S) * P.REPLAN_FILL + 1e-6 or \
        again.timed["fa2_mma"] == []
    # both full candidates still timed, on fewer cases each (not one dropped whole)
    assert 0 < len(again.timed["fa2_mma"]) < len(first.timed["fa2_mma"])
    assert 0 < len(again.timed["sdpa_flash"]) < len(first.timed["sdpa_flash"])
    assert len(again.timed["fa1"]) == P.SMOKE_CASES
    reasons = {(lo.kernel, lo.reason.split(":")[0]) for lo in again.left_out}
    assert ("fa1", "timing = smoke") in reasons
    assert any(lo.kernel == "fa2_mma" and "budget" in lo.reason for lo in again.left_out)
    assert again.to_dict()["correctness_took_s"] == 200.0
    # correctness that took less than estimated gives the time back
    early = P.replan(first, cands, perf, spent_s=5.0)
    assert len(early.timed["fa2_mma"]) >= len(first.timed["fa2_mma"])
