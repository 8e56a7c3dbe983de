"""`fa-harness ci`: the one command a GPU CI job runs on every commit.

Flow: choose, plan, prepare (warm-up, correctness, sanitizer tier) and time the
candidates (harness.runs.gate_run), printing one line per failing case and per finished
candidate -> write the run record (spool first, so nothing is lost) -> store it (it stays
in the spool when the database is unreachable) -> find the baseline (latest run of the
parent commit on the same GPU model, else a window of recent runs on the baseline branch)
-> compare -> store the verdicts -> sync the alerts (harness.records.alerts: a step
is one alert, from its first bad commit) -> write a markdown summary (to --summary, else
$GITHUB_STEP_SUMMARY when set).

Exit code (the README's table): 0 nothing of the team failed or regressed, and every owned
candidate was measured; 1 a team candidate failed a case, could not be loaded or compiled,
regressed (correctness, precision or time) against the baseline, had a sanitizer finding,
or a candidate or case of the baseline is missing from this run without the plan or
--kernels leaving it out; 3 "not measured": nothing failed, but an owned candidate that
should run here did not (no GPU, not available) or got fewer timed cases than its floor,
so the gate cannot say it did not regress (`--require-gpu` on a runner without a working
GPU also exits 3, before running anything, and so does a run with nothing of the team's to
judge: no owned candidate, none named by --kernels); 2 usage/input error. Peers (kind "peer": the
SDPA backends) are yardsticks: where they diverge from the oracle the summary names them
(`peer divergence: ...`), and the gate stays green.

Everything after "run" works on a RunRecord, so the whole flow is testable on a CPU with
synthetic records (`finish`) or with the CPU algorithm models (`execute`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.records.alert_replay import backfill
from harness.records.alerts import AlertError, open_alerts, sync_alerts
from harness.records.compare import CompareError, Report, compare_records
from harness.records.noise import from_db as noise_from_db
from harness.records.record import RunRecord, spool
from harness.runs.gate_confirm import confirm
from harness.runs.gate_options import (
    DEFAULT_GRIDS,
    TIMING_GRIDS,
    GateNotMeasured,
    GateOptions,
    GateUsageError,
)
from harness.runs.gate_run import Execution, execute, gpu_present, select_candidates
from harness.runs.gate_summary import summary_markdown
from harness.runs.plan import Plan

__all__ = ["DEFAULT_GRIDS", "EXIT_NOT_MEASURED", "TIMING_GRIDS", "Execution", "GateNotMeasured",
           "GateOptions", "GateOutcome", "GateUsageError", "execute", "finish", "gpu_present",
           "run_gate", "select_candidates"]

OK_STATUSES = ("passed", "skipped")
EXIT_NOT_MEASURED = 3
# What is known of each peer's divergence from the oracle (results/notes/2026-11-29.md,
# run 2).
PEER_KNOWN = {"sdpa_cudnn": "returns mean(V) on fully masked rows (and a non-zero dQ there "
                            "in the backward)",
              "sdpa_efficient": "rows with no visible key (bottom-right causal, Nq > Nk) "
                                "are not 0"}


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
    not_measured: list[tuple[str, str]] = field(default_factory=list)  # (candidate, why)
    sanitizer: list[Any] = field(default_factory=list)  # SanitizeOutcome per variant
    # The open alerts of this run's GPU model after this run (harness.records.alerts):
    # the summary lists them; they fail nothing by themselves (the verdicts do).
    open_alerts: list[Any] = field(default_factory=list)

    def _yardstick(self, kernel: str) -> bool:
        """A peer, or a candidate the run marked as not the team's (a shipped variant in
        a team's repository): its failures are divergences to report, not the team's."""
        info = self.record.kernels.get(kernel) or {}
        return info.get("kind") == "peer" or info.get("owned") is False

    @property
    def failures(self) -> list[dict[str, Any]]:
        """Failing results of the team's candidates (peers are yardsticks)."""
        return [e for e in self.record.results
                if e["status"] not in OK_STATUSES and not self._yardstick(e["kernel"])]

    @property
    def regressions(self) -> list[Any]:
        """Failing verdicts against the baseline of the team's candidates. A yardstick's
        (a peer's, a shipped variant's in a team's repository) are reported, not failed:
        its time moves with the driver and the library, not with the team's commit."""
        if self.report is None:
            return []
        return [v for v in self.report.failing if not self._yardstick(v.variant)]

    @property
    def yardstick_changes(self) -> list[Any]:
        if self.report is None:
            return []
        return [v for v in self.report.failing if self._yardstick(v.variant)]

    @property
    def sanitizer_findings(self) -> list[Any]:
        return [o for o in self.sanitizer if o.failed]

    @property
    def peer_divergences(self) -> list[str]:
        by_peer: dict[str, list[dict[str, Any]]] = {}
        for e in self.record.results:
            if e["status"] not in OK_STATUSES and self._yardstick(e["kernel"]):
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
        if self.failures or self.load_errors or self.sanitizer_findings or self.regressions:
            return 1
        if self.not_measured:
            return EXIT_NOT_MEASURED
        return 0


# --------------------------------------------------------------------------- finishing


def _steps(db: Any, out: GateOutcome, record: RunRecord) -> None:
    """A step across commits that this commit confirms is a regression of the owned
    candidate even when the pairwise comparison saw none (harness.records.steps)."""
    from harness.records.step_gate import (
        apply_steps,
        confirmed_steps,
        history_with_chips,
        unreported,
    )

    owned = [k for k, info in record.kernels.items() if info.get("owned")]
    if out.report is None or not record.commit or not owned or out.run_id is None:
        return
    series, sources, chips = history_with_chips(db, record.gpu_model_key,
                                                upto_run_id=out.run_id, kernels=owned)
    n = apply_steps(out.report, unreported(db, record.gpu_model_key, out.run_id, series,
                                           confirmed_steps(series, record.commit, sources,
                                                           chips)))
    if n:
        out.notes.append(f"{n} step(s) across commits confirmed by this commit "
                         "(harness.records.steps)")


def excuse_missing(report: Any, plan: Plan | None, *, selected: Sequence[str] | None,
                   case_ids: set[str] | None, not_here: Sequence[str],
                   broken: Sequence[str] = ()) -> None:
    """Mark the baseline's (candidate, case) pairs that a run left out on purpose (its
    plan, --kernels, no GPU here, a grid not run, a load error already reported) in
    `detail["excused"]` of each "missing" verdict of `report` (harness.records.compare.
    Report); every other missing one fails: a kernel must not silently drop out."""
    import fnmatch

    planned = plan.excused() if plan is not None else set()
    for v in report.verdicts:
        if v.verdict != "missing":
            continue
        why = None
        if (v.variant, v.case_id) in planned:
            why = "left out by the plan"
        elif selected and not any(fnmatch.fnmatchcase(v.variant, p) for p in selected):
            why = "not selected by --kernels"
        elif v.variant in not_here:
            why = "needs a GPU"
        elif case_ids is not None and v.case_id not in case_ids:
            why = "case not in this run's grids"
        elif any(v.variant in e for e in broken):
            why = "failed to load (reported as a load error)"
        if why:
            v.detail["excused"] = why


def finish(record: RunRecord, opts: GateOptions, *, notes: Sequence[str] = (),
           log: Callable[[str], None] = print, plan: Plan | None = None,
           load_errors: Sequence[str] = (), case_ids: set[str] | None = None,
           not_here: Sequence[str] = (), not_measured: Sequence[tuple[str, str]] = (),
           sanitizer: Sequence[Any] = ()) -> GateOutcome:
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

    out = GateOutcome(record=record, notes=list(notes), load_errors=list(load_errors),
                      not_measured=list(not_measured), sanitizer=list(sanitizer))
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
                noise = noise_from_db(db, record.gpu_model_key, before_run_id=out.run_id)
                out.report = compare_records(bases, record, opts.policy, base_label=how,
                                             noise=noise)
                excuse_missing(out.report, plan, selected=opts.kernels, case_ids=case_ids,
                               not_here=not_here, broken=load_errors)
                _steps(db, out, record)
                store_comparisons(db, out.run_id, base_runs[0].id, out.report.verdicts,
                                  {r.uuid: r.id for r in base_runs})
                backfill(db)  # a history judged before alerts existed: once
                sync_alerts(db, out.run_id, out.report,
                            owned=lambda k: not out._yardstick(k))
            out.open_alerts = open_alerts(db, record.gpu_model_key)
        except (DatabaseError, CompareError, AlertError) as exc:
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
    confirmed = confirm(record, ex, opts, log=log)  # suspects timed again, before judging
    return finish(record, opts, notes=ex.notes + confirmed, log=log, plan=ex.plan,
                  load_errors=ex.load_errors, case_ids=ex.case_ids, not_here=sorted(ex.not_here),
                  not_measured=ex.not_measured, sanitizer=ex.sanitizer)
