"""Store API of the results database: open it, store run records, query history/baselines.

`store_record` is idempotent on the record uuid (storing a record twice returns the same
run id and adds nothing) and safe with many concurrent writers: variants and cases are
get-or-created with INSERT ... ON CONFLICT DO NOTHING followed by a SELECT, so two writers
racing on the same new kernel or case both end up with the one row the unique constraint
lets through. A record whose uuid is already stored with different content is refused.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Insert, Select, and_, insert, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from harness.cases import Case
from harness.db import migrate
from harness.db.engine import (
    display_url,
    make_engine,
    resolve_url,
    session_factory,
    sqlite_file,
)
from harness.db.models import CaseRow, Comparison, Result, Run, Variant
from harness.record import RunRecord, parse_time

_RESULT_RECORD_ONLY = ("timing_mode", "timing_method", "case_id")


class DatabaseError(Exception):
    """The database cannot be used: unreachable, wrong schema, conflicting data."""


class DatabaseUnavailable(DatabaseError):
    """Cannot connect at all (the caller spools the record instead)."""


class RecordConflict(DatabaseError):
    """A record with this uuid is already stored with different content."""


@dataclass
class Database:
    url: str
    engine: Engine
    sessions: sessionmaker[Session]
    readonly: bool = False

    @property
    def display_url(self) -> str:
        return display_url(self.url)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on error."""
        with self.sessions() as s, s.begin():
            yield s

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_db(url: str | None = None, *, create: bool = True, readonly: bool = False,
            upgrade: bool | None = None) -> Database:
    """Open the database at `url` (see harness.db.engine.resolve_url).

    create: a missing SQLite file (and its directory) is created, and an empty database
    gets the schema. A database behind the current migrations is upgraded when it is a
    SQLite file (`upgrade=None`, the default) - a shared server database is upgraded only
    on request (`fa-harness db upgrade`, or upgrade=True), since other runners use it.
    Raises DatabaseUnavailable when no connection can be made, DatabaseError otherwise."""
    url = resolve_url(url)
    shown = display_url(url)
    path = sqlite_file(url)
    if path is not None and not path.exists():
        if not create or readonly:
            raise DatabaseError(f"no database at {path} (run `fa-harness db upgrade`)")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseUnavailable(f"cannot create {path.parent}: {exc}") from None
    try:
        engine = make_engine(url, readonly=readonly)
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        raise DatabaseError(f"bad database URL {shown}: {exc}") from None
    try:
        with engine.connect() as conn:
            current = migrate.current_revision(conn)
    except (OperationalError, DBAPIError) as exc:
        engine.dispose()
        reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        raise DatabaseUnavailable(f"cannot connect to {shown}: {reason}") from None
    head = migrate.head_revision()
    if current != head:
        auto = upgrade if upgrade is not None else (current is None or path is not None)
        if readonly or not create or not auto:
            engine.dispose()
            have = current or "empty"
            raise DatabaseError(f"database {shown} is at schema revision {have}, this "
                                f"fa-harness needs {head}: run `fa-harness db upgrade --db URL`")
        try:
            migrate.upgrade(engine)
        except SQLAlchemyError as exc:
            engine.dispose()
            raise DatabaseError(f"upgrading {shown} failed: {exc}") from None
    return Database(url=url, engine=engine, sessions=session_factory(engine), readonly=readonly)


# --------------------------------------------------------------------------- writing


def _insert_ignore(dialect: str, table: Any) -> Insert:
    """INSERT that skips rows violating a unique constraint (race-free get-or-create)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).on_conflict_do_nothing()
    return insert(table)


def _get_or_create(s: Session, model: Any, key_cols: Sequence[str],
                   rows: list[dict[str, Any]]) -> dict[tuple, int]:
    """Ids of `rows` keyed by their unique-key tuple, inserting the ones that are new."""
    if not rows:
        return {}
    cols = [getattr(model, c) for c in key_cols]

    def lookup(keys: list[tuple]) -> dict[tuple, int]:
        found: dict[tuple, int] = {}
        for chunk in range(0, len(keys), 200):
            part = keys[chunk:chunk + 200]
            if len(cols) == 1:
                cond = cols[0].in_([k[0] for k in part])
            else:
                from sqlalchemy import tuple_

                cond = tuple_(*cols).in_(part)
            for row in s.execute(select(model.id, *cols).where(cond)):
                found[tuple(row[1:])] = row[0]
        return found

    unique = {tuple(r[c] for c in key_cols): r for r in rows}
    ids = lookup(list(unique))
    missing = [r for k, r in unique.items() if k not in ids]
    if missing:
        dialect = s.get_bind().dialect.name
        if dialect in ("postgresql", "sqlite"):
            s.execute(_insert_ignore(dialect, model.__table__), missing)
        else:  # other backends: one savepoint per row, a lost race is an IntegrityError
            for r in missing:
                try:
                    with s.begin_nested():
                        s.execute(insert(model.__table__), [r])
                except IntegrityError:
                    pass
        ids.update(lookup([k for k in unique if k not in ids]))
    lost = [k for k in unique if k not in ids]
    if lost:
        raise DatabaseError(f"{model.__tablename__}: could not create rows {lost[:3]}")
    return ids


_CLOCK_KEYS = ("sm_clock_mhz", "sm_clock_max_mhz", "sm_clock_default_mhz", "mem_clock_mhz",
               "mem_clock_max_mhz", "clock_event_reasons")


def _run_row(record: RunRecord, sha: str) -> dict[str, Any]:
    gpu = dict(record.gpu or {})
    env = dict(record.env or {})
    # The whole gpu object travels in env["_gpu"] (the export gives it back verbatim); the
    # columns are indexable copies of its main fields.
    env["_gpu"] = record.gpu
    clocks = gpu.get("clocks") or ({k: gpu[k] for k in _CLOCK_KEYS if gpu.get(k) is not None}
                                   or None)
    return {
        "uuid": record.uuid, "commit": record.commit, "parent_commit": record.parent,
        "branch": record.branch, "created_at": parse_time(record.created_at),
        "source": record.source, "gpu_name": gpu.get("name"), "gpu_uuid": gpu.get("uuid"),
        "gpu_model_key": record.gpu_model_key, "driver": gpu.get("driver"),
        "cuda": gpu.get("cuda") or gpu.get("cuda_driver_version") or env.get("torch_cuda"),
        "torch": env.get("torch"), "cupy": env.get("cupy"),
        "python": env.get("python"), "hostname": env.get("hostname"),
        "clocks": clocks, "calibration": record.calibration,
        "grids": list(record.grids), "schema_version": record.schema_version,
        "record_sha256": sha, "env": env,
    }


def _result_row(e: dict[str, Any], run_id: int, variant_id: int, case_pk: int
                ) -> dict[str, Any]:
    errors = e.get("errors") or {}
    b = e.get("bytes") or {}
    extra = dict(e.get("extra") or {})
    # Fields without a column of their own travel in extra["_record"] for a lossless export.
    rest = {k: e[k] for k in _RESULT_RECORD_ONLY if e.get(k) is not None and k != "case_id"}
    err_rest = {k: v for k, v in errors.items()
                if k not in ("out_err", "base_err", "ratio", "lse_err")}
    if err_rest:
        rest["errors"] = err_rest
    if any(k not in ("model", "ideal", "read", "write") for k in b):
        rest["bytes"] = {k: v for k, v in b.items() if k not in ("model", "ideal", "read", "write")}
    if rest:
        extra["_record"] = rest

    def num(v: Any) -> Any:
        return float(v) if isinstance(v, str) else v  # "nan"/"inf" kept as JSON strings

    return {
        "run_id": run_id, "variant_id": variant_id, "case_pk": case_pk,
        "status": e["status"], "message": e.get("message") or "",
        "out_err": num(errors.get("out_err")), "base_err": num(errors.get("base_err")),
        "err_ratio": num(errors.get("ratio")), "lse_err": num(errors.get("lse_err")),
        "samples_ms": list(e.get("samples_ms") or []), "median_ms": e.get("median_ms"),
        "min_ms": e.get("min_ms"), "iqr_ms": e.get("iqr_ms"), "rel_noise": e.get("rel_noise"),
        "dropped_throttled": e.get("dropped_throttled"), "tflops": e.get("tflops"),
        "flops": e.get("flops"), "bytes_model": b.get("model"), "bytes_ideal": b.get("ideal"),
        "bytes_read": b.get("read"), "bytes_write": b.get("write"),
        "registers": e.get("registers"), "spills": e.get("spills"),
        "shared_bytes": e.get("shared_bytes"), "extra": extra,
    }


def store_record(db: Database, record: RunRecord) -> int:
    """Store a run record; returns its run id. Idempotent on `record.uuid`."""
    record.check()
    sha = record.sha256()
    with db.session() as s:
        existing = s.execute(select(Run.id, Run.record_sha256).where(Run.uuid == record.uuid)
                             ).first()
        if existing is None:
            stmt = _insert_ignore(db.dialect, Run.__table__).values(**_run_row(record, sha))
            run_id = s.execute(stmt.returning(Run.__table__.c.id)).scalar()
            if run_id is None:  # a concurrent writer stored the same record just now
                existing = s.execute(select(Run.id, Run.record_sha256)
                                     .where(Run.uuid == record.uuid)).first()
        if existing is not None:
            if existing.record_sha256 != sha:
                raise RecordConflict(f"run {record.uuid} is already stored with different "
                                     f"content (run id {existing.id}); not storing it again")
            return int(existing.id)

        variant_rows = []
        for name in sorted({e["kernel"] for e in record.results} | set(record.kernels)):
            info = record.kernels.get(name) or {}
            variant_rows.append({"name": name, "kind": info.get("kind"),
                                 "source_hash": info.get("source_hash") or "",
                                 "manifest": info.get("manifest")})
        vids = _get_or_create(s, Variant, ("name", "source_hash"), variant_rows)
        case_rows = []
        for e in record.results:
            c = Case.from_dict(e["case"])
            case_rows.append({"case_id": c.id, **{k: v for k, v in c.to_dict().items()}})
        cids = _get_or_create(s, CaseRow, ("case_id",), case_rows)
        rows = []
        for e in record.results:
            info = record.kernels.get(e["kernel"]) or {}
            vid = vids[(e["kernel"], info.get("source_hash") or "")]
            rows.append(_result_row(e, run_id, vid, cids[(Case.from_dict(e["case"]).id,)]))
        if rows:
            s.execute(insert(Result.__table__), rows)
        return int(run_id)


def store_comparisons(db: Database, run_id: int, base_run_id: int | None,
                      verdicts: Sequence[Any]) -> int:
    """Store regression verdicts (objects with variant, case_id, verdict, ratio, p_value,
    detail) of `run_id` against `base_run_id`; earlier verdicts of that pair are replaced."""
    with db.session() as s:
        s.execute(Comparison.__table__.delete().where(
            and_(Comparison.run_id == run_id,
                 Comparison.base_run_id.is_(None) if base_run_id is None
                 else Comparison.base_run_id == base_run_id)))
        rows = [{"run_id": run_id, "base_run_id": base_run_id, "variant": v.variant,
                 "case_id": v.case_id, "verdict": v.verdict, "ratio": v.ratio,
                 "p_value": v.p_value, "detail": v.detail,
                 "created_at": parse_time(_now())} for v in verdicts]
        if rows:
            s.execute(insert(Comparison.__table__), rows)
    return len(rows)


def _now() -> str:
    from harness.record import utc_now_iso

    return utc_now_iso()


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
        errors = {"out_err": res.out_err, "base_err": res.base_err, "ratio": res.err_ratio,
                  "lse_err": res.lse_err, **rest.pop("errors", {})}
        entry = {
            "kernel": var.name,
            "case": Case(case.batch, case.heads, case.kv_heads, case.seqlen_q, case.seqlen_k,
                         case.head_dim, case.dtype, case.mask, case.seed).to_dict(),
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
    from harness.record import iso_utc

    return iso_utc(dt)


def latest_run(db: Database, *, gpu_model_key: str | None = None, branch: str | None = None,
               commit: str | None = None, before: datetime | None = None,
               exclude_id: int | None = None) -> Run | None:
    runs = recent_runs(db, gpu_model_key=gpu_model_key, branch=branch, commit=commit,
                       before=before, exclude_id=exclude_id, limit=1)
    return runs[0] if runs else None


def recent_runs(db: Database, *, gpu_model_key: str | None = None, branch: str | None = None,
                commit: str | None = None, before: datetime | None = None,
                exclude_id: int | None = None, limit: int = 20) -> list[Run]:
    """Newest first, filtered by GPU model, branch, commit, time."""
    q = select(Run)
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


def baseline_runs(db: Database, run: Run, *, branch: str = "main", window: int = 5
                  ) -> tuple[str, list[Run]]:
    """The baseline of `run` on its GPU model: the latest run of the parent commit when
    there is one, else the `window` most recent earlier runs on `branch` (excluding runs of
    the same commit). Only runs sharing a grid with `run` count, so CI jobs that split the
    grids over several GPUs each compare with their own kind of run. Returns (how it was
    chosen, runs newest first)."""
    grids = set(run.grids or [])

    def same_kind(r: Run) -> bool:
        return not grids or not r.grids or bool(grids & set(r.grids))

    if run.parent_commit:
        parents = [r for r in recent_runs(db, gpu_model_key=run.gpu_model_key,
                                          commit=run.parent_commit, exclude_id=run.id)
                   if same_kind(r)]
        if parents:
            return f"parent commit {run.parent_commit[:12]}", parents[:1]
    runs = [r for r in recent_runs(db, gpu_model_key=run.gpu_model_key, branch=branch,
                                   before=run.created_at, exclude_id=run.id,
                                   limit=window * 8)
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


def import_spool(db: Database, directory: str | Path | None = None
                 ) -> tuple[list[int], list[str]]:
    """Store every spooled record; stored ones leave the spool. Returns (run ids, problems:
    one line per record that stayed)."""
    from harness.record import RecordError, spooled

    ids, problems = [], []
    for path in spooled(directory):
        try:
            ids.append(store_record(db, RunRecord.read(path)))
        except (RecordError, RecordConflict) as exc:
            problems.append(f"{path}: {exc}")
            continue
        path.unlink(missing_ok=True)
    return ids, problems


__all__ = [
    "Database", "DatabaseError", "DatabaseUnavailable", "RecordConflict", "baseline_runs",
    "counts", "get_run", "history", "import_spool", "latest_run", "load_record", "open_db",
    "ping", "recent_runs", "store_comparisons", "store_record",
]
