"""The CI gate's plan: which candidate is timed on which case, so `fa-harness ci` fits a
time budget (default 5 minutes on one H200) and says what it left out.

Every candidate is checked on the correctness grids. Timing follows what each candidate
asked for: a variant's manifest says `timing = "full" | "smoke" | "none"` (and optionally
`timing_max_seqlen`); a peer follows `PEER_TIMING` (the baseline of the speed-up column is
timed in full, the math backend not at all). Then:

1. correctness first (always run: it is what makes the gate red for a wrong answer);
2. every "smoke" candidate on its two cheapest timing cases (also always run);
3. the "full" candidates round-robin, each on its next cheapest case, while the estimate
   stays inside `PLAN_FILL` of the budget.

What is not timed is listed with its reason (manifest, sequence-length cap, budget), goes
into the run record (`env["ci_plan"]`) and the summary, and excuses those (candidate,
case) pairs from the "missing against the baseline" rule.

The cost estimates come from the committed H200 records (results/h200-20261129T201729Z-*):
4 candidates x 48 perf cases took 187 s and 4 x 20 decode cases 63 s with `--min-time
0.2`, about 0.8-1.0 s per timed case of which 0.2 s is sampling; the rates below are the
median TFLOP/s of each candidate in those records (tests/test_plan.py re-derives them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.core.cases import Case
from harness.core.flops import attention_flops
from harness.core.iomodel import ideal_bytes

DEFAULT_BUDGET_MIN = 5.0
DEFAULT_MIN_TIME_S = 0.2  # sampling time per timed case in the gate (the records' setting)
SMOKE_CASES = 2
# Fraction of the budget the estimate may fill: the rest is slack for start-up, the
# database and estimation error.
PLAN_FILL = 0.8

# Seconds per timed (candidate, case) beyond sampling: the check, input sets, the child's
# messages (from the records: (187 s - 192 x 0.2 s) / 192 cases ~ 0.77 s).
TIMED_CASE_OVERHEAD_S = 0.75
# A candidate's timing child: spawn, torch and CUDA start-up, NVRTC compile (cached).
CHILD_START_S = 4.0
# Correctness: per (candidate, case) on the GPU (small smoke shapes) and on the CPU.
CHECK_GPU_S = 0.15
CHECK_CPU_S = 0.5
# A Python candidate on the GPU compiles per shape (Triton; flex_attention through
# Inductor): its first call of each smoke case is a compile.
CHECK_PYTHON_GPU_S = 1.5
MIN_SAMPLES = 20

# Median TFLOP/s over the committed H200 perf record (fa2_mma 245, sdpa_flash 299,
# sdpa_cudnn 468, fa2_simt 15.8); the serial teaching kernels were never timed across the
# grid: their rate is a deliberate underestimate.
RATE_TFLOPS: dict[str, float] = {"fa2_mma": 245.0, "sdpa_flash": 299.0, "sdpa_cudnn": 468.0,
                                 "fa2_simt": 15.8, "splitkv": 100.0, "sdpa_efficient": 150.0}
# Decode shapes are bound by memory: no call is faster than its ideal bytes at this rate
# (splitkv reached 2.1-2.5 TB/s in the decode record).
BANDWIDTH_GBPS = 2000.0
DEFAULT_RATE_TFLOPS = 2.0

PEER_TIMING = {"sdpa_flash": "full", "sdpa_math": "none"}  # other peers: "smoke"
# Seconds kept free at the end of the budget: the process start before the clock starts
# (torch, CUDA), the record, the database and the summary.
RESERVE_S = 20.0
# Once correctness has run, the estimate only has the timing left to miss: a smaller
# margin than PLAN_FILL.
REPLAN_FILL = 0.9


def replan(plan: Plan, candidates: Sequence[Any], timing_cases: Sequence[Case],
           spent_s: float) -> Plan:
    """The timing part planned again from what is really left after correctness
    (`spent_s` into the run): the Python candidates' per-shape compiles, a slow machine or
    a slow kernel make correctness cost what no estimate made beforehand can know, and
    the time left is shared out again, cheapest cases first, instead of dropping whole
    candidates at the end. The first plan's correctness estimate is kept for the record."""
    room = plan.budget_s - spent_s - RESERVE_S
    new = make_plan(candidates, [], timing_cases, budget_min=plan.budget_s / 60.0,
                    min_time_s=plan.min_time_s, gpu=True, room_s=room)
    new.correctness_s = plan.correctness_s
    new.correctness_took_s = spent_s
    return new


def timing_mode(cand: Any) -> tuple[str, int | None]:
    """(mode, max seqlen) a candidate asked for."""
    meta = getattr(cand, "meta", None) or {}
    if meta.get("timing"):
        return str(meta["timing"]), meta.get("timing_max_seqlen")
    if getattr(cand, "kind", None) == "peer":
        return PEER_TIMING.get(cand.name, "smoke"), None
    return "full", None


def timed_case_cost_s(cand_name: str, case: Case, min_time_s: float = DEFAULT_MIN_TIME_S
                      ) -> float:
    rate = RATE_TFLOPS.get(cand_name, DEFAULT_RATE_TFLOPS) * 1e12
    call_s = max(attention_flops(case) / rate, ideal_bytes(case) / (BANDWIDTH_GBPS * 1e9))
    # the sampling lasts min_time or 20 samples (each with its L2 flush), whichever is longer
    return TIMED_CASE_OVERHEAD_S + max(min_time_s, MIN_SAMPLES * call_s * 1.3) + 3 * call_s


@dataclass
class LeftOut:
    kernel: str
    reason: str
    cases: list[str] = field(default_factory=list)

    def line(self) -> str:
        return f"{self.kernel}: {len(self.cases)} timing case(s) not timed ({self.reason})"


@dataclass
class Plan:
    budget_s: float
    min_time_s: float
    correctness_s: float = 0.0
    correctness_took_s: float | None = None  # measured, once the re-plan has run
    timed: dict[str, list[Case]] = field(default_factory=dict)  # candidate -> cases, in order
    timed_s: float = 0.0
    left_out: list[LeftOut] = field(default_factory=list)

    @property
    def estimate_s(self) -> float:
        return self.correctness_s + self.timed_s

    def excused(self) -> set[tuple[str, str]]:
        """(kernel, case id) pairs the plan chose not to time."""
        return {(lo.kernel, c) for lo in self.left_out for c in lo.cases}

    def lines(self) -> list[str]:
        n = sum(len(v) for v in self.timed.values())
        out = [f"plan: budget {self.budget_s / 60:g} min, estimate {self.estimate_s:.0f} s "
               f"(correctness {self.correctness_s:.0f} s, {n} timed case(s) "
               f"{self.timed_s:.0f} s)"]
        out += [f"timed: {k} on {len(v)} case(s)" for k, v in self.timed.items() if v]
        out += [f"left out: {lo.line()}" for lo in self.left_out]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"budget_s": self.budget_s, "min_time_s": self.min_time_s,
                "estimate_s": round(self.estimate_s, 1),
                "correctness_s": round(self.correctness_s, 1),
                "correctness_took_s": (None if self.correctness_took_s is None
                                       else round(self.correctness_took_s, 1)),
                "timed": {k: [c.id for c in v] for k, v in self.timed.items()},
                "left_out": [{"kernel": lo.kernel, "reason": lo.reason, "cases": lo.cases}
                             for lo in self.left_out]}


def _supports(cand: Any, case: Case) -> bool:
    try:
        return cand.supports(case) is None
    except Exception:  # noqa: BLE001 - a support test that raises: let the run say why
        return True


def make_plan(candidates: Sequence[Any], check_cases: Sequence[Case],
              timing_cases: Sequence[Case], *, budget_min: float = DEFAULT_BUDGET_MIN,
              min_time_s: float = DEFAULT_MIN_TIME_S, gpu: bool = True,
              room_s: float | None = None) -> Plan:
    """The plan of the module doc. `room_s`: the seconds timing may take, given instead of
    derived from the budget (the re-plan once correctness has run and its real cost is
    known, `replan`)."""
    plan = Plan(budget_s=budget_min * 60.0, min_time_s=min_time_s)
    for cand in candidates:
        on_gpu = getattr(cand, "device", "cpu") == "cuda"
        if on_gpu and not gpu:
            continue
        per = ((CHECK_PYTHON_GPU_S if getattr(cand, "kind", "") == "python" else CHECK_GPU_S)
               if on_gpu else CHECK_CPU_S)
        plan.correctness_s += per * len(check_cases) + (CHILD_START_S if cand.isolate else 0)
    if not gpu or not timing_cases:
        return plan
    room = (plan.budget_s * PLAN_FILL - plan.correctness_s if room_s is None
            else room_s * REPLAN_FILL)
    queues: dict[str, list[tuple[float, Case]]] = {}
    for cand in candidates:
        if getattr(cand, "device", "cpu") != "cuda":
            continue
        mode, cap = timing_mode(cand)
        supported = [c for c in timing_cases if _supports(cand, c)]
        if mode == "none":
            if supported:
                plan.left_out.append(LeftOut(cand.name, "timing = none",
                                             [c.id for c in supported]))
            continue
        if cap is not None:
            over = [c for c in supported if max(c.seqlen_q, c.seqlen_k) > cap]
            if over:
                plan.left_out.append(LeftOut(cand.name, f"timing_max_seqlen = {cap}",
                                             [c.id for c in over]))
            supported = [c for c in supported if c not in over]
        costed = sorted(((timed_case_cost_s(cand.name, c, min_time_s), c) for c in supported),
                        key=lambda t: (t[0], t[1].id))
        if mode == "smoke":
            if costed[SMOKE_CASES:]:
                plan.left_out.append(LeftOut(cand.name, "timing = smoke: its "
                                             f"{SMOKE_CASES} cheapest cases only",
                                             [c.id for _, c in costed[SMOKE_CASES:]]))
            costed = costed[:SMOKE_CASES]
            plan.timed[cand.name] = [c for _, c in costed]
            cost = sum(s for s, _ in costed) + (CHILD_START_S if costed else 0.0)
            plan.timed_s += cost
            room -= cost
        elif costed:
            plan.timed[cand.name] = []
            # the first case also pays for the candidate's timing child
            costed[0] = (costed[0][0] + CHILD_START_S, costed[0][1])
            queues[cand.name] = costed
    # The full candidates share what is left, cheapest case first, one case each in turn.
    budget_cut: dict[str, list[str]] = {}
    while queues:
        for name in list(queues):
            cost, case = queues[name][0]
            if cost <= room:
                queues[name].pop(0)
                plan.timed[name].append(case)
                plan.timed_s += cost
                room -= cost
            else:  # sorted by cost: none of the rest fits either
                budget_cut[name] = [c.id for _, c in queues[name]]
                queues[name] = []
            if not queues[name]:
                del queues[name]
    for name, ids in budget_cut.items():
        plan.left_out.append(LeftOut(name, f"over the {budget_min:g} min budget", ids))
    return plan


def excuse_missing(report: Any, plan: Plan | None, *, selected: Sequence[str] | None,
                   case_ids: set[str] | None, not_here: Sequence[str],
                   broken: Sequence[str] = ()) -> None:
    """Mark the baseline's (candidate, case) pairs that a run left out on purpose (its
    plan, --kernels, no GPU here, a grid not run, a load error already reported) in
    `detail["excused"]` of each "missing" verdict of `report` (harness.records.compare.
    Report); every other missing one fails: a kernel must not silently drop out."""
    planned = plan.excused() if plan is not None else set()
    for v in report.verdicts:
        if v.verdict != "missing":
            continue
        why = None
        if (v.variant, v.case_id) in planned:
            why = "left out by the plan"
        elif selected and v.variant not in selected:
            why = "not selected by --kernels"
        elif v.variant in not_here:
            why = "needs a GPU"
        elif case_ids is not None and v.case_id not in case_ids:
            why = "case not in this run's grids"
        elif any(v.variant in e for e in broken):
            why = "failed to load (reported as a load error)"
        if why:
            v.detail["excused"] = why
