"""Reading the results database: one run, a whole record back, the latest and recent runs, the
baseline window of a run, the history of one (kernel, case), counts.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Select, select, text

from harness.core.cases import Case
from harness.records.db.database import (
    Database,
    DatabaseError,
)
from harness.records.db.models import CaseRow, Comparison, Result, Run, Variant
from harness.records.record import RunRecord, json_safe

# --------------------------------------------------------------------------- reading


def get_run(db: Database, ref: str | int) -> Run:
    """A run by id, uuid, or "latest". Raises DatabaseError when there is none."""
    with db.session() as s:
        q: Select[tuple[Run]]
        if str(ref) == "latest":
            q = select(Run).order_by(Run.created_at.desc(), Run.id.desc()).limit(1)
        elif str(ref).isdigit():
            q = select(Run).where(Run.id == int(ref))
        else:
            q = select(Run).where(Run.uuid == str(ref))
        run = s.execute(q).scalar_one_or_none()
    if run is None:
        raise DatabaseError(f"no run {ref!r} in {db.display_url}")
    return run


def load_record(db: Database, ref: str | int) -> RunRecord:
    """Rebuild the run record of a stored run (export; inverse of store_record)."""
    run = get_run(db, ref)
    with db.session() as s:
        rows = s.execute(
            select(Result, Variant, CaseRow)
            .join(Variant, Result.variant_id == Variant.id)
            .join(CaseRow, Result.case_pk == CaseRow.id)
            .where(Result.run_id == run.id).order_by(Result.id)).all()
    env = dict(run.env or {})
    gpu = env.pop("_gpu", None)
    kernels: dict[str, dict[str, Any]] = {}
    results = []
    for res, var, case in rows:
        info: dict[str, Any] = {}
        if var.kind is not None:
            info["kind"] = var.kind
        if var.source_hash:
            info["source_hash"] = var.source_hash
        if var.manifest is not None:
            info["manifest"] = var.manifest
        kernels[var.name] = info
        extra = dict(res.extra or {})
        rest = extra.pop("_record", {})
        # A non-finite float of a column (a run stored before its spelling was kept in
        # "_record") is written as the record format spells it: "inf", "-inf", "nan".
        errors = {**json_safe({"out_err": res.out_err, "base_err": res.base_err,
                               "ratio": res.err_ratio, "lse_err": res.lse_err}),
                  **rest.pop("errors", {})}
        entry = {
            "kernel": var.name,
            "case": Case.from_id(case.case_id).to_dict(),
            "case_id": case.case_id, "status": res.status, "message": res.message or "",
            "errors": errors, "samples_ms": list(res.samples_ms or []),
            "median_ms": res.median_ms, "min_ms": res.min_ms, "iqr_ms": res.iqr_ms,
            "rel_noise": res.rel_noise, "dropped_throttled": res.dropped_throttled,
            "flops": res.flops, "tflops": res.tflops,
            "bytes": {"model": res.bytes_model, "ideal": res.bytes_ideal,
                      "read": res.bytes_read, "write": res.bytes_write, **rest.pop("bytes", {})},
            "registers": res.registers, "spills": res.spills, "shared_bytes": res.shared_bytes,
            "extra": extra, **rest,
        }
        results.append(entry)
    return RunRecord(uuid=run.uuid, created_at=_iso(run.created_at), commit=run.commit,
                     gpu=gpu, results=results, parent=run.parent_commit, branch=run.branch,
                     source=run.source, env=env, calibration=run.calibration,
                     grids=list(run.grids or []), kernels=kernels,
                     schema_version=run.schema_version)


def _iso(dt: datetime) -> str:
    from harness.records.record import iso_utc

    return iso_utc(dt)


def latest_run(db: Database, *, gpu_model_key: str | None = None, branch: str | None = None,
               commit: str | None = None, before: datetime | None = None,
               exclude_id: int | None = None, trusted_only: bool = False) -> Run | None:
    runs = recent_runs(db, gpu_model_key=gpu_model_key, branch=branch, commit=commit,
                       before=before, exclude_id=exclude_id, limit=1,
                       trusted_only=trusted_only)
    return runs[0] if runs else None


def recent_runs(db: Database, *, gpu_model_key: str | None = None, branch: str | None = None,
                commit: str | None = None, before: datetime | None = None,
                exclude_id: int | None = None, limit: int = 20,
                trusted_only: bool = False) -> list[Run]:
    """Newest first, filtered by GPU model, branch, commit, time, and origin (`trusted_only`:
    runs stored by a trusted path, migration 0007)."""
    q = select(Run)
    if trusted_only:
        q = q.where(Run.trusted.is_(True))
    if gpu_model_key is not None:
        q = q.where(Run.gpu_model_key == gpu_model_key)
    if branch is not None:
        q = q.where(Run.branch == branch)
    if commit is not None:
        q = q.where(Run.commit == commit)
    if before is not None:
        q = q.where(Run.created_at < before)
    if exclude_id is not None:
        q = q.where(Run.id != exclude_id)
    q = q.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit)
    with db.session() as s:
        return list(s.execute(q).scalars())


def baseline_runs(db: Database, run: Run, *, branch: str = "main", window: int = 5,
                  trusted_only: bool = True) -> tuple[str, list[Run]]:
    """The baseline of `run` on its GPU model: the latest run of the parent commit when
    there is one, else the `window` most recent earlier runs on `branch` (excluding runs of
    the same commit). Only runs sharing a grid with `run` count, so CI jobs that split the
    grids over several GPUs each compare with their own kind of run. Only trusted runs
    count (`trusted_only`): an imported record of a made-up commit with halved times must
    not become what the next genuine commit is judged against. Returns (how it was
    chosen, runs newest first)."""
    grids = set(run.grids or [])

    def same_kind(r: Run) -> bool:
        return not grids or not r.grids or bool(grids & set(r.grids))

    if run.parent_commit:
        parents = [r for r in recent_runs(db, gpu_model_key=run.gpu_model_key,
                                          commit=run.parent_commit, exclude_id=run.id,
                                          trusted_only=trusted_only)
                   if same_kind(r)]
        if parents:
            return f"parent commit {run.parent_commit[:12]}", parents[:1]
    runs = [r for r in recent_runs(db, gpu_model_key=run.gpu_model_key, branch=branch,
                                   before=run.created_at, exclude_id=run.id,
                                   limit=window * 8, trusted_only=trusted_only)
            if (run.commit is None or r.commit != run.commit) and same_kind(r)][:window]
    return (f"last {len(runs)} run(s) on {branch}" if runs else "none"), runs


def history(db: Database, variant: str, case_id: str, *, gpu_model_key: str | None = None,
            limit: int = 200) -> list[dict[str, Any]]:
    """One kernel on one case over time (newest first): the dashboard's trend line."""
    q = (select(Run.id, Run.created_at, Run.commit, Run.branch, Run.gpu_model_key,
                Result.status, Result.median_ms, Result.tflops, Result.err_ratio,
                Variant.source_hash)
         .join(Result, Result.run_id == Run.id)
         .join(Variant, Result.variant_id == Variant.id)
         .join(CaseRow, Result.case_pk == CaseRow.id)
         .where(Variant.name == variant, CaseRow.case_id == case_id))
    if gpu_model_key is not None:
        q = q.where(Run.gpu_model_key == gpu_model_key)
    q = q.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit)
    with db.session() as s:
        return [dict(r._mapping) for r in s.execute(q)]


def counts(db: Database) -> dict[str, int]:
    """Row counts per table (tests, `fa-harness db upgrade` report)."""
    from sqlalchemy import func

    out = {}
    with db.session() as s:
        for model in (Run, Variant, CaseRow, Result, Comparison):
            out[model.__tablename__] = int(s.execute(
                select(func.count()).select_from(model)).scalar_one())
    return out


def ping(db: Database) -> None:
    with db.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
