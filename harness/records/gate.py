"""`fa-harness ci`: the one command a GPU CI job runs on every commit.

Flow: load anything left in the spool -> plan the run to fit the time budget
(harness.records.plan: correctness for every candidate, timing as each asked for) -> run
it (correctness through harness.execution.runner, timing through harness.measure.perf when
a GPU is present), printing one line per failing case and per finished candidate -> write
the run record (spool first, so nothing is lost) -> store it (it stays in the spool when the
database is unreachable) -> find the baseline (latest run of the parent commit on the same
GPU model, else a window of recent runs on the baseline branch) -> compare -> store the
verdicts -> write a markdown summary (to --summary, else $GITHUB_STEP_SUMMARY when set).

Exit code (the README's table): 0 nothing of the team failed or regressed; 1 a team
candidate failed a case, could not be loaded or compiled, regressed (correctness,
precision or time) against the baseline, or a candidate or case of the baseline is
missing from this run without the plan or --kernels leaving it out; 2 usage/input error.
Peers (kind "peer": the SDPA backends) are yardsticks: where they diverge from the oracle
the summary names them (`peer divergence: ...`), and the gate stays green.

Everything after "run" works on a RunRecord, so the whole flow is testable on a CPU with
synthetic records (`finish`) or with the CPU algorithm models (`execute`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.results import CaseResult
from harness.records.compare import DEFAULT_POLICY, CompareError, Policy, Report, compare_records
from harness.records.gate_summary import summary_markdown
from harness.records.plan import (
    CHILD_START_S,
    DEFAULT_BUDGET_MIN,
    DEFAULT_MIN_TIME_S,
    RESERVE_S,
    LeftOut,
    Plan,
    excuse_missing,
    make_plan,
    replan,
    timed_case_cost_s,
)
from harness.records.record import RunRecord, environment, spool
from harness.records.run_meta import calibration_object, gpu_meta, kernel_info, plain_dict

# Grids whose purpose is timing; without a GPU they are reported as not run.
TIMING_GRIDS = frozenset({"perf", "decode"})
DEFAULT_GRIDS = ("smoke", "perf", "decode")
BASELINE = "sdpa_flash"  # the speed-up column's reference (harness.measure.perf)
OK_STATUSES = ("passed", "skipped")
# A case that hangs costs its candidate this much once (harness.execution.isolate stops
# the candidate there), not the budget.
DEFAULT_CASE_TIMEOUT_S = 60.0
# What is known of each peer's divergence from the oracle (docs/h200-runs.md, run 2).
PEER_KNOWN = {"sdpa_cudnn": "returns mean(V) on fully masked rows",
              "sdpa_efficient": "rows with no visible key (bottom-right causal, Nq > Nk) "
                                "are not 0"}


class GateUsageError(ValueError):
    """Bad gate input (unknown grid or kernel): exit code 2."""


@dataclass
class GateOptions:
    grids: list[str] = field(default_factory=lambda: list(DEFAULT_GRIDS))
    kernels: list[str] | None = None
    db_url: str | None = None
    baseline_branch: str = "main"
    window: int = 5
    summary: Path | None = None
    record_path: Path | None = None
    spool_dir: Path | None = None
    secret: int = 0
    source: str = "ci"
    policy: Policy = DEFAULT_POLICY
    budget_min: float = DEFAULT_BUDGET_MIN
    min_time_s: float = DEFAULT_MIN_TIME_S
    timeout_s: float = DEFAULT_CASE_TIMEOUT_S
    # A stored run (id, uuid, "latest") to compare with instead of the parent/branch rule.
    baseline_run: str | None = None


@dataclass
class GateOutcome:
    record: RunRecord
    record_path: Path | None = None
    run_id: int | None = None
    spooled: Path | None = None
    db_error: str | None = None
    baseline: str = "none"
    report: Report | None = None
    notes: list[str] = field(default_factory=list)
    summary: str = ""
    load_errors: list[str] = field(default_factory=list)
    plan: Plan | None = None

    def _kind(self, kernel: str) -> str | None:
        return (self.record.kernels.get(kernel) or {}).get("kind")

    @property
    def failures(self) -> list[dict[str, Any]]:
        """Failing results of the team's candidates (peers are yardsticks)."""
        return [e for e in self.record.results
                if e["status"] not in OK_STATUSES and self._kind(e["kernel"]) != "peer"]

    @property
    def peer_divergences(self) -> list[str]:
        by_peer: dict[str, list[dict[str, Any]]] = {}
        for e in self.record.results:
            if e["status"] not in OK_STATUSES and self._kind(e["kernel"]) == "peer":
                by_peer.setdefault(e["kernel"], []).append(e)
        lines = []
        for name, bad in sorted(by_peer.items()):
            known = PEER_KNOWN.get(name)
            first = (bad[0].get("message") or "").strip().splitlines()
            lines.append(f"peer divergence: {name}" + (f" {known}" if known else "")
                         + f", {len(bad)} case(s); first {bad[0]['case_id']}: "
                         + (first[0][:120] if first else bad[0]["status"]))
        return lines

    @property
    def exit_code(self) -> int:
        if self.failures or self.load_errors or (self.report is not None
                                                 and self.report.regressed):
            return 1
        return 0


# --------------------------------------------------------------------------- running


def gpu_present() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken CUDA install means "no GPU" for the gate
        return False


def select_candidates(candidates: Sequence[Any], names: Sequence[str] | None) -> list[Any]:
    if not names:
        return list(candidates)
    known = {c.name: c for c in candidates}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise GateUsageError(f"unknown kernel(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(known)) or 'none'}")
    return [known[n] for n in names]


@dataclass
class Execution:
    results: list[CaseResult]
    meta: dict[str, Any]
    notes: list[str]
    plan: Plan | None
    load_errors: list[str]
    case_ids: set[str]  # every case of the grids this run covered
    not_here: set[str]  # candidates selected but not runnable on this machine


def execute(opts: GateOptions, *, log: Callable[[str], None] = print) -> Execution:
    """Plan and run the chosen grids."""
    from harness.candidates.registry import discover, load_errors
    from harness.core.grids import get_grid
    from harness.execution.report import LineReport
    from harness.execution.runner import run_correctness

    t0 = time.monotonic()
    gpu = gpu_present()
    notes: list[str] = []
    cases_by_grid = {}
    for g in opts.grids:
        try:
            cases_by_grid[g] = get_grid(g)
        except ValueError as exc:
            raise GateUsageError(str(exc)) from None
    pool = discover()
    broken = load_errors()
    # A variant that failed to load is a failure of the gate, named; also when it was
    # asked for by --kernels (then it is not an unknown name).
    broken_names = {getattr(e, "variant", "") for e in broken}
    errors = [str(e) for e in broken if not opts.kernels
              or getattr(e, "variant", "") in opts.kernels or not getattr(e, "variant", "")]
    wanted = None if not opts.kernels else [n for n in opts.kernels if n not in broken_names]
    candidates = [] if opts.kernels and not wanted else select_candidates(pool, wanted)
    not_here: set[str] = set()
    if not gpu:
        not_here = {c.name for c in candidates if c.device != "cpu"}
        candidates = [c for c in candidates if c.device == "cpu"]
        if not_here:
            notes.append(f"no GPU: {len(not_here)} GPU candidate(s) not run "
                         f"({', '.join(sorted(not_here))})")
    if not candidates and not errors:
        raise GateUsageError("no candidate to run on this machine")
    check_cases = [c for g, cs in cases_by_grid.items() if g not in TIMING_GRIDS for c in cs]
    timing_cases = [c for g, cs in cases_by_grid.items() if g in TIMING_GRIDS for c in cs]
    if timing_cases and not gpu:
        notes.append(f"grid {', '.join(g for g in opts.grids if g in TIMING_GRIDS)}: "
                     "timing needs a GPU; not run")
    plan = make_plan(candidates, check_cases, timing_cases, budget_min=opts.budget_min,
                     min_time_s=opts.min_time_s, gpu=gpu)
    for line in plan.lines():
        log(line)
    for err in errors:
        log(f"FAIL load error: {err}")
    results: list[CaseResult] = []
    if check_cases:
        log(f"correctness: {len(check_cases)} case(s) x {len(candidates)} candidate(s)")
        report = LineReport({c.name: len(check_cases) for c in candidates}, stream=sys.stdout)
        results += run_correctness(candidates, check_cases, secret=opts.secret,
                                   timeout_s=opts.timeout_s, on_result=report)
    if gpu and plan.timed:
        before = {k: len(v) for k, v in plan.timed.items()}
        plan = replan(plan, candidates, timing_cases, time.monotonic() - t0)
        after = {k: len(v) for k, v in plan.timed.items()}
        if after != before:
            log(f"re-plan: correctness took {plan.correctness_took_s:.0f} s (estimate "
                f"{plan.correctness_s:.0f} s); timing {sum(after.values())} case(s), "
                f"{plan.timed_s:.0f} s")
    calibration = calibration_object(notes) if gpu and plan.timed else None
    timed_results: list[CaseResult] = []
    # The speed-up column's baseline first: without it no ratio can be computed.
    for cand in sorted(candidates, key=lambda c: c.name != BASELINE):
        cases = plan.timed.get(cand.name) or []
        if not cases:
            continue
        # The estimate was made before the timing ran: if the run so far took longer, a
        # candidate whose timing would pass the budget is left out (and said so).
        spent = time.monotonic() - t0
        cost = CHILD_START_S + sum(timed_case_cost_s(cand.name, c, opts.min_time_s)
                                   for c in cases)
        if spent + cost > plan.budget_s - RESERVE_S:
            plan.left_out.append(LeftOut(cand.name, f"{spent:.0f} s spent, its ~{cost:.0f} s "
                                         "would pass the budget", [c.id for c in cases]))
            plan.timed[cand.name] = []
            log(f"left out: {plan.left_out[-1].line()}")
            continue
        from harness.measure.perf import run_perf

        report = LineReport({cand.name: len(cases)}, stream=sys.stdout, label=" (timed)")
        timed_results += run_perf([cand], cases, calibration=calibration,
                                  timeout_s=opts.timeout_s,
                                  timing={"rule": {"min_time_s": opts.min_time_s}},
                                  log=log, on_result=report)
    if timed_results:
        from harness.measure.perf import add_baseline_ratios

        add_baseline_ratios(timed_results, BASELINE)
    results = _dedupe(results + timed_results)
    kernels = {c.name: kernel_info(c) for c in candidates}
    env = environment()
    env["ci_plan"] = plan.to_dict()
    env["ci_plan"]["wall_s"] = round(time.monotonic() - t0, 1)
    if errors:
        env["ci_load_errors"] = errors
    meta: dict[str, Any] = {"source": opts.source, "grids": list(opts.grids),
                            "kernels": kernels, "env": env}
    meta["gpu"] = gpu_meta() if gpu else None
    meta["calibration"] = plain_dict(calibration)
    ids = {c.id for c in check_cases} | ({c.id for c in timing_cases} if gpu else set())
    return Execution(results, meta, notes, plan, errors, ids, not_here)


def _dedupe(results: list[CaseResult]) -> list[CaseResult]:
    """One result per (kernel, case): a case in two grids keeps the later (timed) one,
    unless that one was skipped and the earlier one was not."""
    by_key: dict[tuple[str, str], CaseResult] = {}
    for r in results:
        key = (r.kernel, r.case.id)
        prev = by_key.get(key)
        if prev is not None and r.status == "skipped" and prev.status != "skipped":
            continue
        by_key[key] = r
    return list(by_key.values())


# --------------------------------------------------------------------------- finishing


def finish(record: RunRecord, opts: GateOptions, *, notes: Sequence[str] = (),
           log: Callable[[str], None] = print, plan: Plan | None = None,
           load_errors: Sequence[str] = (), case_ids: set[str] | None = None,
           not_here: Sequence[str] = ()) -> GateOutcome:
    """Write, store, compare, summarise one run record."""
    from harness.records.db.store import (
        Database,
        DatabaseError,
        baseline_runs,
        get_run,
        import_spool,
        load_record,
        open_db,
        store_comparisons,
        store_record,
    )

    out = GateOutcome(record=record, notes=list(notes), load_errors=list(load_errors))
    out.plan = plan
    # The record is on disk before the database is touched: a crash from here on loses
    # nothing (the spool copy is removed only once the database has it).
    from harness.records.db.engine import target_of

    out.spooled = spool(record, opts.spool_dir, target=target_of(opts.db_url))
    if opts.record_path is not None:
        out.record_path = record.write(opts.record_path)
    db: Database | None = None
    try:
        db = open_db(opts.db_url)
        loaded, problems = import_spool(db, opts.spool_dir)  # includes this record
        out.notes += problems
        if len(loaded) > 1:
            out.notes.append(f"loaded {len(loaded) - 1} earlier spooled record(s)")
        out.run_id = store_record(db, record)
        out.spooled = out.spooled if out.spooled.exists() else None
    except DatabaseError as exc:
        out.db_error = str(exc)
        out.notes.append(f"database unavailable, record kept in {out.spooled}: {exc}")
        log(f"warning: {out.notes[-1]}")
    if db is not None and out.run_id is not None:
        try:
            run = get_run(db, out.run_id)
            if opts.baseline_run is not None:
                base_runs = [get_run(db, opts.baseline_run)]
                how = f"run {base_runs[0].id} (--baseline {opts.baseline_run})"
            else:
                how, base_runs = baseline_runs(db, run, branch=opts.baseline_branch,
                                               window=opts.window)
            out.baseline = how
            if base_runs:
                bases = [load_record(db, r.id) for r in base_runs]
                out.report = compare_records(bases, record, opts.policy, base_label=how)
                excuse_missing(out.report, plan, selected=opts.kernels, case_ids=case_ids,
                               not_here=not_here, broken=load_errors)
                store_comparisons(db, out.run_id, base_runs[0].id, out.report.verdicts)
        except (DatabaseError, CompareError) as exc:
            out.notes.append(f"comparison not done: {exc}")
        finally:
            db.close()
    out.summary = summary_markdown(out)
    target = opts.summary or (Path(os.environ["GITHUB_STEP_SUMMARY"])
                              if os.environ.get("GITHUB_STEP_SUMMARY") else None)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a", encoding="utf-8") as f:  # GitHub appends step summaries
            f.write(out.summary)
    return out


def check_baseline_run(opts: GateOptions) -> None:
    """A --baseline that names no stored run is a usage error, found before running."""
    if opts.baseline_run is None:
        return
    from harness.records.db.store import DatabaseError, get_run, open_db

    if opts.baseline_run == "latest":
        raise GateUsageError("--baseline takes a run id or uuid ('latest' would be this run)")
    try:
        with open_db(opts.db_url, create=False) as db:
            get_run(db, opts.baseline_run)
    except DatabaseError as exc:
        raise GateUsageError(f"--baseline {opts.baseline_run}: {exc}") from None


def run_gate(opts: GateOptions, *, log: Callable[[str], None] = print) -> GateOutcome:
    check_baseline_run(opts)
    ex = execute(opts, log=log)
    record = RunRecord.from_results(ex.results, ex.meta)
    return finish(record, opts, notes=ex.notes, log=log, plan=ex.plan,
                  load_errors=ex.load_errors, case_ids=ex.case_ids, not_here=sorted(ex.not_here))
