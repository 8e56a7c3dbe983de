"""Verdicts for runs stored without a gate: each run against its baseline.

`fa-harness ci` compares the run it made with its baseline as it stores it. Records that
arrive another way (`fa-harness import` of committed records, of a spool left by a CI job
whose database was down) get the same comparison here, so an imported history shows its
regressions: the baseline is chosen by `db.queries.baseline_runs` (the run of the parent
commit on the same GPU model, else the recent runs before it on the run's own branch, of
the same grid) and judged by `compare.compare_records`, exactly as the gate does.

A run stored from an untrusted origin (`fa-harness import` without `--trusted`) is not
judged: it is never a baseline, and verdicts of it would raise alerts for a history that
nobody vouched for. Storing it again with `--trusted` judges it then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select

from harness.records.alert_replay import backfill
from harness.records.alerts import record_owned, sync_alerts
from harness.records.compare import DEFAULT_POLICY, CompareError, Policy, compare_records
from harness.records.db.database import Database
from harness.records.db.models import Comparison
from harness.records.db.queries import baseline_runs, get_run, load_record
from harness.records.noise import from_db as noise_from_db
from harness.records.record import RunRecord
from harness.records.step_gate import apply_steps, confirmed_steps, history_with_chips, unreported

# The gate's defaults (GateOptions.window, .baseline_branch), so an imported run is judged
# against the runs a CI job on its branch would have compared it with.
WINDOW = 5
FALLBACK_BRANCH = "main"


@dataclass(frozen=True)
class Judged:
    run_id: int
    baseline: str  # how the baseline was chosen ("none" when there is none)
    base_run_id: int | None
    counts: dict[str, int]
    note: str | None = None  # why no verdicts were stored, when none were


def has_verdicts(db: Database, run_id: int) -> bool:
    with db.session() as s:
        return s.execute(select(Comparison.id).where(Comparison.run_id == run_id)
                         .limit(1)).scalar() is not None


def judge_runs(db: Database, run_ids: Sequence[int], *, policy: Policy = DEFAULT_POLICY,
               window: int = WINDOW) -> list[Judged]:
    """Compare each run that has no verdicts yet with its baseline and store the verdicts.

    Runs are judged oldest first, so a batch of imported records chains: each one's
    baseline may be the one imported just before it. A run that already has verdicts
    (compared by `ci`, or imported before) is left as it is."""
    from harness.records.db.store import store_comparisons

    runs = sorted((get_run(db, r) for r in dict.fromkeys(run_ids)),
                  key=lambda r: (r.created_at, r.id))
    out: list[Judged] = []
    # A stored run's record never changes, and an import judges each run against the few
    # before it: each is read from the database once per call.
    loaded: dict[int, RunRecord] = {}

    def record(run_id: int) -> RunRecord:
        if run_id not in loaded:
            loaded[run_id] = load_record(db, run_id)
        return loaded[run_id]

    for run in runs:
        if has_verdicts(db, run.id):
            continue
        if not run.trusted:
            out.append(Judged(run.id, "untrusted", None, {},
                              note=f"stored untrusted ({run.origin}): not judged, never a "
                                   "baseline"))
            continue
        how, bases = baseline_runs(db, run, branch=run.branch or FALLBACK_BRANCH,
                                   window=window)
        if not bases:
            out.append(Judged(run.id, how, None, {}))
            continue
        try:
            new = record(run.id)
            noise = noise_from_db(db, new.gpu_model_key, before_run_id=run.id)
            report = compare_records([record(b.id) for b in bases], new, policy,
                                     base_label=how, noise=noise)
            if new.commit:  # a stored record's series is searched for steps it confirms
                series, sources, chips = history_with_chips(db, new.gpu_model_key,
                                                            upto_run_id=run.id,
                                                            kernels=sorted(new.kernels))
                steps = confirmed_steps(series, new.commit, sources, chips)
                apply_steps(report, unreported(db, new.gpu_model_key, run.id, series, steps))
        except CompareError as exc:
            out.append(Judged(run.id, how, bases[0].id, {}, note=str(exc)))
            continue
        store_comparisons(db, run.id, bases[0].id, report.verdicts,
                          {b.uuid: b.id for b in bases})
        backfill(db)  # a history judged before alerts existed: once
        sync_alerts(db, run.id, report, owned=record_owned(new))
        out.append(Judged(run.id, how, bases[0].id, report.counts()))
    return out
