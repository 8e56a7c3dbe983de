"""The gate's confirmation runs (harness.records.confirm): after timing, before the run
is stored and judged, each suspect candidate's timed cases are timed again in fresh
timing children, one after the other, nothing else on the GPU, and their medians go
into the record.

What a suspect is, and why a fresh child each time, is the records module's doc. Here:
- The preliminary verdicts use the gate's own baseline (`--baseline`, else the parent
  commit's run or the recent runs of the baseline branch) and the noise model of the
  database; with no database, no baseline or no GPU timing nothing is confirmed (said
  in a note when the database could not be read).
- Each confirmation times exactly the cases the run timed for that candidate-pass, with
  the same stopping rule and calibration, forward or backward.
- The time it took is in the record (`env.ci_confirm`) and in the log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness.core.results import Status
from harness.records.record import RunRecord
from harness.runs.gate_options import GateOptions


def confirm_runs(opts: GateOptions) -> int:
    from harness.records.confirm import CONFIRM_RUNS, MAX_CONFIRM_RUNS

    n = CONFIRM_RUNS if opts.confirm_runs is None else opts.confirm_runs
    return max(0, min(MAX_CONFIRM_RUNS, n))


def confirm(record: RunRecord, ex: Any, opts: GateOptions, *,
            log: Callable[[str], None] = print,
            time_again: Callable[..., list[Any]] | None = None) -> list[str]:
    """Time the record's suspects again (module doc) and add what they read to
    `record`; returns notes for the summary. `ex`: the gate's Execution.
    `time_again(candidate, cases, backward=...)`: the timing (default: a fresh child by
    harness.measure.perf.run_perf, as the gate timed them)."""
    from harness.records.confirm import preliminary, suspects, timed_keys, with_confirmations
    from harness.records.db.store import DatabaseError, open_db

    runs = confirm_runs(opts)
    plan = ex.plan
    if runs == 0 or plan is None or not (plan.timed or plan.timed_bwd):
        return []
    try:
        with open_db(opts.db_url) as db:
            report = preliminary(db, record, policy=opts.policy, branch=opts.baseline_branch,
                                 window=opts.window, baseline_run=opts.baseline_run)
    except DatabaseError as exc:
        return [f"confirmation runs not considered: database unavailable ({exc})"]
    found = suspects(report, owned=ex.owned)
    if not found:
        return []
    by_name = {c.name: c for c in ex.candidates}
    timer = time_again or _default_timer(opts, ex)
    done: list[dict[str, Any]] = []
    notes: list[str] = []
    for s in found:
        cand = by_name.get(s.variant)
        timed = (plan.timed_bwd if s.pass_name == "bwd" else plan.timed).get(s.variant) or []
        keys = set(timed_keys(record, s.variant, s.pass_name))
        cases = [c for c in timed if (s.variant, s.pass_name, c.id) in keys]
        if cand is None or not cases:
            continue
        log(f"confirming {s.variant} ({s.pass_name}): read {s.ratio - 1:+.2%} "
            f"(p = {s.p_value:.2g}); timing its {len(cases)} case(s) {runs} more time(s), "
            "each in a fresh child")
        t0 = time.monotonic()
        got: dict[tuple[str, str, str], list[float]] = {}
        for _ in range(runs):
            for r in timer(cand, cases, backward=s.pass_name == "bwd"):
                med = r.timing.median_ms if r.timing is not None else None
                if Status(r.status) is Status.PASSED and med:
                    got.setdefault((s.variant, s.pass_name, r.case.id), []).append(float(med))
        n = with_confirmations(record, got)
        took = time.monotonic() - t0
        done.append({"kernel": s.variant, "pass": s.pass_name, "ratio": s.ratio,
                     "p_value": s.p_value, "runs": runs, "cases": n, "wall_s": round(took, 1)})
        notes.append(f"{s.variant} ({s.pass_name}) read {s.ratio - 1:+.2%} at first: timed "
                     f"{runs} more time(s) on {n} case(s) ({took:.0f} s), judged on the mean")
    if done:
        record.env["ci_confirm"] = done
    return notes


def _default_timer(opts: GateOptions, ex: Any) -> Callable[..., list[Any]]:
    def time_again(cand: Any, cases: list[Any], *, backward: bool) -> list[Any]:
        from harness.measure.perf import run_perf

        return run_perf([cand], cases, calibration=ex.calibration, timeout_s=opts.timeout_s,
                        timing={"rule": {"min_time_s": opts.min_time_s}},
                        log=lambda _line: None, backward=backward)
    return time_again
