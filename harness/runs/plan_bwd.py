"""The CI gate's backward: which candidates get their backward checked and timed.

An owned candidate that declares a backward (a manifest's `[backward]`, a Python
candidate's `backward=`) gets it judged on the correctness grids (harness.core.check_grad)
and timed on `BWD_TIMING_MIN` cases (never cut for the budget, as the forward's floor);
fewer timed backward cases than that is "not measured" (harness.runs.gate), exactly
as for the forward. The cases are the candidate's own forward-timed cases first (so the
two passes of one kernel are seen on the same shapes), decode shapes left out (a
backward of one query row is not what training runs) and so are the masks its backward
does not declare (`Support.backward_masks`), then the rest of the timing grid in the
spread order. The speed-up baseline's backward is timed on the same cases.
Yardsticks' backwards are not timed by the gate: `fa-harness run --grid perf-bwd` does.

The estimate is the forward's cost model at `BWD_COST_FACTOR` the work (the backward
does 2.5x the forward's FLOPs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.core.cases import Case
from harness.runs.plan import BASELINE, Plan, timed_case_cost_s
from harness.runs.plan_order import spread_order

BWD_TIMING_MIN = 4
BWD_COST_FACTOR = 2.5
DECODE_MAX_SEQLEN_Q = 16  # as harness.measure.perf: below this a case is decode-shaped


def has_backward(cand: Any) -> bool:
    support = getattr(cand, "support", None)
    return bool(getattr(support, "backward", False))


def backward_checked(candidates: Sequence[Any], owned: Sequence[str]) -> list[Any]:
    """The candidates whose backward the gate judges on its correctness grids."""
    return [c for c in candidates if c.name in owned and has_backward(c)]


def _supports(cand: Any, case: Case) -> bool:
    """Whether `cand`'s backward runs `case` as far as the plan can tell: its forward
    support and its backward's declaration (`Support.reason_unsupported_backward`: the
    masks it declares). A backend's own `supports_backward` probe runs the backend, so it
    is left to the run, which skips such a case with the reason."""
    try:
        if cand.supports(case) is not None:
            return False
    except Exception:  # noqa: BLE001 - a support test that raises: let the run say why
        return True
    declared = getattr(getattr(cand, "support", None), "reason_unsupported_backward", None)
    return declared is None or declared(case) is None


def plan_backward(plan: Plan, candidates: Sequence[Any], timing_cases: Sequence[Case], *,
                  owned: Sequence[str], floor: int = BWD_TIMING_MIN) -> None:
    """Fill `plan.timed_bwd` and `plan.minimum_bwd` (the module doc), in place."""
    plan.timed_bwd.clear()
    plan.minimum_bwd.clear()
    pool = [c for c in timing_cases if c.seqlen_q > DECODE_MAX_SEQLEN_Q]
    by_name = {c.name: c for c in candidates}
    union: list[Case] = []
    for cand in backward_checked(candidates, owned):
        if getattr(cand, "device", "cpu") != "cuda":
            continue
        ours = [c for c in plan.timed.get(cand.name, []) if c in pool and _supports(cand, c)]
        rest = [c for c in spread_order([c for c in pool if _supports(cand, c)])
                if c not in ours]
        cases = (ours + rest)[:floor]
        if not cases:
            continue
        plan.timed_bwd[cand.name] = cases
        plan.minimum_bwd[cand.name] = len(cases)
        union += [c for c in cases if c not in union]
    base = by_name.get(BASELINE)
    if base is not None and BASELINE not in plan.timed_bwd and has_backward(base) and union:
        plan.timed_bwd[BASELINE] = [c for c in union if _supports(base, c)]
    for name, cases in plan.timed_bwd.items():
        plan.timed_s += sum(BWD_COST_FACTOR * timed_case_cost_s(name, c, plan.min_time_s)
                            for c in cases)
