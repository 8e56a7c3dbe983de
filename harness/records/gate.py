"""`fa-harness ci`: the one command a GPU CI job runs.

Flow: load anything left in the spool -> run the grids (correctness through
harness.execution.runner; timing through harness.measure.perf when a GPU is present) -> write the run record
(spool first, so nothing is lost) -> store it (it stays in the spool when the database is
unreachable) -> find the baseline (latest run of the parent commit on the same GPU model,
else a window of recent runs on the baseline branch) -> compare -> store the verdicts ->
write a markdown summary (to --summary, else $GITHUB_STEP_SUMMARY when set) -> exit code:
0 all passed and nothing regressed, 1 a failure or a regression, 2 usage/input error.

Everything after "run the grids" works on a RunRecord, so the whole flow is testable on a
CPU with synthetic records (`finish`) or with the CPU algorithm models (`execute`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.results import CaseResult
from harness.records.compare import DEFAULT_POLICY, CompareError, Policy, Report, compare_records
from harness.records.record import RunRecord, gpu_model_key, spool

# Grids whose purpose is timing; without a GPU they are reported as not run.
TIMING_GRIDS = frozenset({"perf", "decode"})
OK_STATUSES = ("passed", "skipped")


class GateUsageError(ValueError):
    """Bad gate input (unknown grid or kernel): exit code 2."""


@dataclass
class GateOptions:
    grids: list[str] = field(default_factory=lambda: ["smoke", "perf"])
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

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [e for e in self.record.results if e["status"] not in OK_STATUSES]

    @property
    def exit_code(self) -> int:
        if self.failures or (self.report is not None and self.report.regressed):
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


def execute(opts: GateOptions, *, log: Callable[[str], None] = print
            ) -> tuple[list[CaseResult], dict[str, Any], list[str]]:
    """Run the chosen grids; returns (results, record metadata, notes for the summary)."""
    from harness.candidates.registry import discover
    from harness.core.grids import get_grid
    from harness.execution.runner import run_correctness

    gpu = gpu_present()
    notes: list[str] = []
    cases_by_grid = {}
    for g in opts.grids:
        try:
            cases_by_grid[g] = get_grid(g)
        except ValueError as exc:
            raise GateUsageError(str(exc)) from None
    candidates = select_candidates(discover(), opts.kernels)
    if not gpu:
        gpu_only = [c.name for c in candidates if c.device != "cpu"]
        candidates = [c for c in candidates if c.device == "cpu"]
        if gpu_only:
            notes.append(f"no GPU: {len(gpu_only)} GPU candidate(s) not run "
                         f"({', '.join(sorted(gpu_only))})")
    if not candidates:
        raise GateUsageError("no candidate to run on this machine")
    results: list[CaseResult] = []
    calibration = calibration_object(notes) if gpu else None
    for g, cases in cases_by_grid.items():
        if g in TIMING_GRIDS:
            if not gpu:
                notes.append(f"grid {g}: timing needs a GPU; not run")
                continue
            from harness.measure.perf import run_perf

            timed = [c for c in candidates if c.device == "cuda"]
            log(f"timing grid {g}: {len(cases)} case(s) x {len(timed)} candidate(s)")
            results += run_perf(timed, cases, calibration=calibration, log=log)
        else:
            log(f"correctness grid {g}: {len(cases)} case(s) x {len(candidates)} candidate(s)")
            results += run_correctness(candidates, cases, secret=opts.secret)
    results = _dedupe(results)
    meta: dict[str, Any] = {"source": opts.source, "grids": list(opts.grids),
                            "kernels": {c.name: kernel_info(c) for c in candidates}}
    meta["gpu"] = gpu_meta() if gpu else None
    meta["calibration"] = _as_dict(calibration)
    return results, meta, notes


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


def kernel_info(c: Any) -> dict[str, Any]:
    meta = dict(getattr(c, "meta", {}) or {})
    info: dict[str, Any] = {"kind": getattr(c, "kind", None),
                            "source_hash": str(meta.get("source_hash") or "")}
    if meta.get("manifest") is not None:
        info["manifest"] = meta["manifest"]
    for key in ("registers", "spills", "shared_bytes"):
        if meta.get(key) is not None:
            info[key] = meta[key]
    return info


def gpu_meta() -> dict[str, Any] | None:
    from harness.measure.gpuinfo import gpu_identity

    ident = gpu_identity().to_dict()
    ident.setdefault("model_key", gpu_model_key(ident.get("name")))
    return ident


def calibration_object(notes: list[str]) -> Any | None:
    """This runner's calibration (harness.measure.calibrate), or None with a note why not."""
    try:
        from harness.measure.calibrate import load_calibration

        cal = load_calibration()
    except Exception as exc:  # noqa: BLE001 - a bad calibration file must not stop the gate
        notes.append(f"calibration not loaded: {exc}")
        return None
    if cal is None:
        notes.append("no calibration for this runner: no physical time floor applied")
    return cal


def _as_dict(obj: Any) -> dict[str, Any] | None:
    if obj is None or isinstance(obj, dict):
        return obj
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    from dataclasses import asdict, is_dataclass

    return asdict(obj) if is_dataclass(obj) else {"value": str(obj)}


# --------------------------------------------------------------------------- finishing


def finish(record: RunRecord, opts: GateOptions, *, notes: Sequence[str] = (),
           log: Callable[[str], None] = print) -> GateOutcome:
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

    out = GateOutcome(record=record, notes=list(notes))
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
            how, base_runs = baseline_runs(db, run, branch=opts.baseline_branch,
                                           window=opts.window)
            out.baseline = how
            if base_runs:
                bases = [load_record(db, r.id) for r in base_runs]
                out.report = compare_records(bases, record, opts.policy, base_label=how)
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


def run_gate(opts: GateOptions, *, log: Callable[[str], None] = print) -> GateOutcome:
    results, meta, notes = execute(opts, log=log)
    record = RunRecord.from_results(results, meta)
    return finish(record, opts, notes=notes, log=log)


# --------------------------------------------------------------------------- summary


def summary_markdown(out: GateOutcome) -> str:
    rec = out.record
    status_counts: dict[str, int] = {}
    for e in rec.results:
        status_counts[e["status"]] = status_counts.get(e["status"], 0) + 1
    verdict = "FAILED" if out.exit_code else "passed"
    lines = [f"## fa-harness CI: {verdict}", "",
             f"- commit `{(rec.commit or '-')[:12]}` on `{rec.branch or '-'}`, "
             f"GPU `{rec.gpu_model_key}`, grids {', '.join(rec.grids) or '-'}",
             "- results: " + (", ".join(f"{k} {n}" for k, n in sorted(status_counts.items()))
                               or "none"),
             f"- run record `{rec.uuid}`" + (f", stored as run {out.run_id}" if out.run_id
                                              else ", not stored (spooled)"),
             f"- baseline: {out.baseline}"]
    for n in out.notes:
        lines.append(f"- note: {n}")
    fails = out.failures
    if fails:
        lines += ["", f"### Failing results ({len(fails)})", "",
                  "| kernel | case | status | message |", "|---|---|---|---|"]
        for e in fails[:50]:
            msg = (e.get("message") or "").replace("|", "\\|").replace("\n", " ")[:160]
            lines.append(f"| `{e['kernel']}` | `{e['case_id']}` | {e['status']} | {msg} |")
        if len(fails) > 50:
            lines.append(f"\n... and {len(fails) - 50} more")
    if out.report is not None:
        lines += ["", "### Against the baseline", "", out.report.markdown()]
    return "\n".join(lines) + "\n"


def print_outcome(out: GateOutcome, stream: Any = None) -> None:
    stream = stream or sys.stdout
    print(out.summary, file=stream)
