"""The CI gate's plan: which candidate is timed on which case, so `fa-harness ci` measures
what the team owns first and fits a time budget (default 5 minutes on one H200), and says
what it left out.

Owned and yardstick candidates (harness.candidates.registry.owned): the team's own
candidates (its kernel folders, Python candidates outside fa-harness, anything named with
`--kernels`) are what the gate is for; the SDPA peers and what ships with fa-harness are
yardsticks. Every candidate is checked on the correctness grids. Timing follows what each
asked for (a variant's manifest: `timing = "full" | "smoke" | "none"`, optionally
`timing_max_seqlen`, `timing_min`, `timing_cases`; a peer: `PEER_TIMING`), in this order
of priority:

1. each owned candidate's floor, `timing_min` cases (`--timing-min`, else its manifest's,
   else `[tool.fa-harness] timing-min`, else 8; a "smoke" candidate: its 2), and the
   speed-up baseline on the same cases;
   this is never cut for the budget: a gate that times nothing is worse than a late one;
2. each yardstick on `YARDSTICK_CASES` cases, while the estimate fits the budget;
3. the owned candidates, one case each in turn, up to `timing_cases` (in the same order:
   `--timing-cases`, the manifest's, `[tool.fa-harness] timing-cases`, 16), while the
   estimate fits;
4. the baseline on those further cases too, while the estimate fits.

An owned "full" candidate's cases are taken in `spread_order`: strata of the grid (decode
or not, head dim, mask, dtype, GQA) in turn, the middle sequence length of each first, so
a few timed cases already cover the grid's kinds instead of its smallest shapes; "smoke"
candidates and yardsticks take their cheapest cases. An owned candidate that
ends with fewer timed cases than its floor is "not measured" (harness.runs.gate).

What is not timed is listed with its reason (manifest, sequence-length cap, yardstick,
target reached, budget), goes into the run record (`env["ci_plan"]`) and the summary,
and excuses those (candidate, case) pairs from the "missing against the baseline" rule.

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
from harness.runs.plan_order import cheapest_first, spread_order

DEFAULT_BUDGET_MIN = 5.0
DEFAULT_MIN_TIME_S = 0.2  # sampling time per timed case in the gate (the records' setting)
SMOKE_CASES = 2
YARDSTICK_CASES = 2
DEFAULT_TIMING_MIN = 8
DEFAULT_TIMING_CASES = 16
BASELINE = "sdpa_flash"  # the speed-up column's reference (harness.measure.perf)
# Fraction of the budget the estimate may fill: the rest is slack for start-up, the
# database and estimation error.
PLAN_FILL = 0.8
# What the plan and the gate's summary say when the estimate is past the budget: the
# floors' doing (rule 1 is never cut), not a planner that ignored its budget.
OVER_BUDGET = "over the budget: the owned candidates' floors are never cut"

# Seconds per timed (candidate, case) beyond sampling: the check, input sets, the child's
# messages (from the records: (187 s - 192 x 0.2 s) / 192 cases ~ 0.77 s).
TIMED_CASE_OVERHEAD_S = 0.75
# A candidate's timing child: spawn, torch and CUDA start-up, NVRTC compile (cached).
CHILD_START_S = 4.0
# The gate starts every timing child side by side before the first is timed
# (harness.runs.gate_run), so at timing time a child costs only its turn.
CHILD_TURN_S = 1.0
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
    compile_took_s: float | None = None  # the warm-up's wall time, apart from correctness
    timed: dict[str, list[Case]] = field(default_factory=dict)  # candidate -> cases, in order
    timed_s: float = 0.0
    left_out: list[LeftOut] = field(default_factory=list)
    # Owned candidates that can be timed here -> their floor of timed cases.
    minimum: dict[str, int] = field(default_factory=dict)
    # Candidate -> the cases it would be timed on with time to spare (owned: up to its
    # target), in timing order: what the warm-up compiles before the clock starts.
    wanted: dict[str, list[Case]] = field(default_factory=dict)
    # The backward's timing and floors (harness.runs.plan_bwd).
    timed_bwd: dict[str, list[Case]] = field(default_factory=dict)
    minimum_bwd: dict[str, int] = field(default_factory=dict)

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
        if self.estimate_s > self.budget_s:
            out.append(f"plan: {OVER_BUDGET}")
        for k, v in self.timed.items():
            if v:
                floor = (f" (owned, at least {self.minimum[k]})" if k in self.minimum
                         else "")
                out.append(f"timed: {k} on {len(v)} case(s){floor}")
        out += [f"timed: {k} (bwd) on {len(v)} case(s)" for k, v in self.timed_bwd.items()]
        out += [f"left out: {lo.line()}" for lo in self.left_out]
        return out

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 1)

        return {"budget_s": self.budget_s, "min_time_s": self.min_time_s,
                "estimate_s": round(self.estimate_s, 1),
                "correctness_s": round(self.correctness_s, 1),
                "correctness_took_s": r(self.correctness_took_s),
                "compile_took_s": r(self.compile_took_s),
                "minimum": dict(self.minimum),
                "timed": {k: [c.id for c in v] for k, v in self.timed.items()},
                "timed_bwd": {k: [c.id for c in v] for k, v in self.timed_bwd.items()},
                "minimum_bwd": dict(self.minimum_bwd),
                "left_out": [{"kernel": lo.kernel, "reason": lo.reason, "cases": lo.cases}
                             for lo in self.left_out]}


def _supports(cand: Any, case: Case) -> bool:
    try:
        return cand.supports(case) is None
    except Exception:  # noqa: BLE001 - a support test that raises: let the run say why
        return True


@dataclass
class Demand:
    """What one GPU candidate asks of the timing: its cases in order, floor, target."""

    name: str
    owned: bool
    cases: list[Case]
    minimum: int
    target: int
    taken: int = 0
    cost: list[float] = field(default_factory=list)


def _demand(cand: Any, timing_cases: Sequence[Case], plan: Plan, *, owned: bool,
            timing_min: int, timing_target: int, min_time_s: float,
            forced_min: int | None = None, forced_target: int | None = None
            ) -> Demand | None:
    mode, cap = timing_mode(cand)
    supported = spread_order([c for c in timing_cases if _supports(cand, c)])
    if mode == "none":
        if supported:
            plan.left_out.append(LeftOut(cand.name, "timing = none", [c.id for c in supported]))
        return None
    if cap is not None:
        over = [c for c in supported if max(c.seqlen_q, c.seqlen_k) > cap]
        if over:
            plan.left_out.append(LeftOut(cand.name, f"timing_max_seqlen = {cap}",
                                         [c.id for c in over]))
        supported = [c for c in supported if c not in over]
    meta = getattr(cand, "meta", None) or {}
    if mode == "smoke" or not owned:
        # The teaching kernels are slow by design and a yardstick only needs a reading:
        # their cheapest cases, not the spread.
        supported = cheapest_first(supported, [timed_case_cost_s(cand.name, c, min_time_s)
                                               for c in supported])
    if mode == "smoke":
        minimum = SMOKE_CASES if owned else 0
        target = SMOKE_CASES if owned else min(SMOKE_CASES, YARDSTICK_CASES)
    elif owned:
        # What the command line asked for beats the manifest, which beats the project.
        minimum = forced_min if forced_min is not None else meta.get("timing_min")
        minimum = timing_min if minimum is None else int(minimum)
        target = forced_target if forced_target is not None else meta.get("timing_cases")
        target = max(minimum, timing_target if target is None else int(target))
    else:
        minimum, target = 0, YARDSTICK_CASES
    d = Demand(cand.name, owned, supported, min(minimum, len(supported)),
               min(target, len(supported)))
    d.cost = [timed_case_cost_s(cand.name, c, min_time_s) for c in supported]
    if mode == "smoke" and len(supported) > d.target:
        plan.left_out.append(LeftOut(cand.name, f"timing = smoke: {d.target} case(s) only",
                                     [c.id for c in supported[d.target:]]))
        d.cases = supported[:d.target]
    return d


def _correctness_s(candidates: Sequence[Any], check_cases: Sequence[Case], gpu: bool,
                   parallel: int) -> float:
    """Correctness estimate: isolated candidates run side by side (`parallel` at a time),
    the in-process ones one after the other in the gate's own process."""
    lanes: list[float] = []
    in_process = 0.0
    for cand in candidates:
        on_gpu = getattr(cand, "device", "cpu") == "cuda"
        if on_gpu and not gpu:
            continue
        per = ((CHECK_PYTHON_GPU_S if getattr(cand, "kind", "") == "python" else CHECK_GPU_S)
               if on_gpu else CHECK_CPU_S)
        cost = per * len(check_cases)
        if getattr(cand, "isolate", False):
            lanes.append(cost + CHILD_START_S)
        else:
            in_process += cost
    total = sum(lanes)
    return max(in_process, max(lanes, default=0.0), total / max(1, parallel))


def make_plan(candidates: Sequence[Any], check_cases: Sequence[Case],
              timing_cases: Sequence[Case], *, budget_min: float = DEFAULT_BUDGET_MIN,
              min_time_s: float = DEFAULT_MIN_TIME_S, gpu: bool = True,
              room_s: float | None = None, owned: Sequence[str] = (),
              timing_min: int = DEFAULT_TIMING_MIN,
              timing_target: int = DEFAULT_TIMING_CASES, parallel: int = 1,
              child_start_s: float = CHILD_START_S, forced_min: int | None = None,
              forced_target: int | None = None) -> Plan:
    """The plan of the module doc. `owned`: names of the team's candidates. `timing_min`,
    `timing_target`: the floor and target where a manifest says none; `forced_min`,
    `forced_target`: set on the command line, they beat a manifest's too. `room_s`: the
    seconds timing may take, given instead of derived from the budget (the re-plan once
    correctness has run and its real cost is known, `replan`). `child_start_s`: what each
    candidate's timing child costs before its first case."""
    plan = Plan(budget_s=budget_min * 60.0, min_time_s=min_time_s)
    plan.correctness_s = _correctness_s(candidates, check_cases, gpu, parallel)
    if not gpu or not timing_cases:
        return plan
    room = (plan.budget_s * PLAN_FILL - plan.correctness_s if room_s is None
            else room_s * REPLAN_FILL)
    demands: dict[str, Demand] = {}
    for cand in candidates:
        if getattr(cand, "device", "cpu") != "cuda":
            continue
        d = _demand(cand, timing_cases, plan, owned=cand.name in owned,
                    timing_min=timing_min, timing_target=timing_target, min_time_s=min_time_s,
                    forced_min=forced_min, forced_target=forced_target)
        if d is not None:
            demands[cand.name] = d
            plan.timed[cand.name] = []
            plan.wanted[cand.name] = d.cases[:d.target]
            if d.owned:
                plan.minimum[d.name] = d.minimum
    base = demands.get(BASELINE)

    def base_cost(case: Case) -> float | None:
        """What timing the baseline on `case` as well would add (None: not needed)."""
        if base is None or case not in base.cases or case in plan.timed[BASELINE]:
            return None
        return base.cost[base.cases.index(case)] + (child_start_s if not plan.timed[BASELINE]
                                                    else 0.0)

    def follow(case: Case) -> float:
        extra = base_cost(case)
        if extra is None:
            return 0.0
        plan.timed[BASELINE].append(case)
        plan.timed_s += extra
        return extra

    def take(d: Demand, with_baseline: bool = True) -> float:
        """Time d's next case (and the baseline's, when it follows); returns the cost."""
        case, cost = d.cases[d.taken], d.cost[d.taken]
        cost += child_start_s if d.taken == 0 else 0.0
        d.taken += 1
        plan.timed[d.name].append(case)
        plan.timed_s += cost
        return cost + (follow(case) if with_baseline and d is not base else 0.0)

    def next_cost(d: Demand, with_baseline: bool = True) -> float:
        cost = d.cost[d.taken] + (child_start_s if d.taken == 0 else 0.0)
        extra = base_cost(d.cases[d.taken]) if with_baseline and d is not base else None
        return cost + (extra or 0.0)

    owned_d = [d for d in demands.values() if d.owned]
    yard_d = [d for d in demands.values() if not d.owned and d is not base]
    # 1. the floors, whatever the budget says
    for d in owned_d:
        while d.taken < d.minimum:
            room -= take(d)
    # 2. the yardsticks' few (the baseline is one when nothing owned needs it)
    if base is not None and not base.owned and not plan.timed[BASELINE]:
        yard_d.insert(0, base)
    for d in yard_d:
        while d.taken < d.target and next_cost(d, False) <= room:
            room -= take(d, False)
    # 3. the owned candidates up to their targets, one case each in turn
    active = [d for d in owned_d if d.taken < d.target]
    while active:
        for d in list(active):
            if d.taken < d.target and next_cost(d, False) <= room:
                room -= take(d, False)
            else:
                active.remove(d)
    # 4. the baseline on those cases too, as far as the budget goes (the speed-up column)
    for d in owned_d:
        for case in plan.timed[d.name][d.minimum:]:
            extra = base_cost(case)
            if extra is not None and extra <= room:
                room -= follow(case)
    budget_note = f"over the {budget_min:g} min budget"
    for d in demands.values():
        done = {c.id for c in plan.timed[d.name]}
        rest = [c.id for c in d.cases if c.id not in done]
        if not rest:
            continue
        if d.taken >= d.target and d.owned:
            why = f"timing_cases = {d.target} reached"
        elif d.taken >= d.target:
            why = f"yardstick: {d.target} case(s) timed"
        else:
            why = budget_note
        plan.left_out.append(LeftOut(d.name, why, rest))
    return plan


def replan(plan: Plan, candidates: Sequence[Any], timing_cases: Sequence[Case],
           spent_s: float, **kw: Any) -> Plan:
    """The timing part planned again from what is really left after the warm-up and
    correctness (`spent_s` into the run): a cold compile cache, a slow machine or a slow
    kernel make them cost what no estimate made beforehand can know. The floors of the
    owned candidates are kept whatever is left; the first plan's correctness estimate is
    kept for the record. `kw`: make_plan's ownership and timing settings."""
    room = plan.budget_s - spent_s - RESERVE_S - CHILD_START_S  # the children's start
    new = make_plan(candidates, [], timing_cases, budget_min=plan.budget_s / 60.0,
                    min_time_s=plan.min_time_s, gpu=True, room_s=room,
                    child_start_s=CHILD_TURN_S, **kw)
    new.correctness_s = plan.correctness_s
    new.correctness_took_s = spent_s
    new.compile_took_s = plan.compile_took_s
    new.wanted = plan.wanted
    return new
