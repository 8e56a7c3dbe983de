"""Store API of the results database: open it, store run records, query history/baselines.

`store_record` is idempotent on the record uuid (storing a record twice returns the same
run id and adds nothing) and safe with many concurrent writers: variants and cases are
get-or-created with INSERT ... ON CONFLICT DO NOTHING followed by a SELECT, so two writers
racing on the same new kernel or case both end up with the one row the unique constraint
lets through. A record whose uuid is already stored with different content is refused.
`store_records` stores several in one transaction: all of them, or none.

Anything the database itself refuses (a value its column cannot hold, a constraint) is a
`RecordRefused` with the database's one-line reason, never a raw driver exception; a lost
connection is `DatabaseUnavailable`. The spool import sets refused records aside
(`<spool>/rejected/`, with the reason next to them) and goes on with the others.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Insert, and_, insert, or_, select
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from harness.core.cases import Case
from harness.records.db.database import (
    Database,
    DatabaseError,
    DatabaseUnavailable,
    RecordConflict,
    open_db,
)
from harness.records.db.models import CaseRow, Comparison, Result, Run, Variant
from harness.records.db.queries import (
    baseline_runs,
    counts,
    get_run,
    history,
    latest_run,
    load_record,
    ping,
    recent_runs,
)
from harness.records.record import RunRecord, entry_pass, parse_time

_RESULT_RECORD_ONLY = ("timing_mode", "timing_method", "case_id", "pass", "confirm_ms", "parent_ms")


class RecordRefused(DatabaseError):
    """The database refused to store a record (the record stays where it was)."""


@dataclass(frozen=True)
class Origin:
    """Where a stored run came from: the path that stored it (`how`: "ci", "run",
    "import", ...), by whom (`by`: user@host, a token's name), and whether baselines, the
    noise history and the step search may use it. Never read from the record itself: a
    record says what it claims to be (`source`), the storing path says who vouches for it."""

    how: str
    by: str
    trusted: bool = True

    @property
    def label(self) -> str:
        return f"{self.how} by {self.by}"[:255]


def who() -> str:
    """user@host of this process (an origin's `by`)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def local_origin(how: str, *, trusted: bool = True) -> Origin:
    """A run stored by this harness on this machine (`ci`, `run`, its spool)."""
    return Origin(how, who(), trusted)


# The store is the database's one public face: opening and reading are re-exported here.
__all__ = [
    "Database", "DatabaseError", "DatabaseUnavailable", "RecordConflict", "open_db",
    "baseline_runs", "counts", "get_run", "history", "latest_run", "load_record", "ping",
    "recent_runs", "import_spool", "store_comparisons", "store_record", "store_records",
    "RecordRefused", "Origin", "local_origin", "who",
]

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


def _run_row(record: RunRecord, sha: str, origin: Origin) -> dict[str, Any]:
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
        "record_sha256": sha, "env": env, "origin": origin.label, "trusted": origin.trusted,
    }


def _result_row(e: dict[str, Any], run_id: int, variant_id: int, case_pk: int
                ) -> dict[str, Any]:
    errors = e.get("errors") or {}
    b = e.get("bytes") or {}
    extra = dict(e.get("extra") or {})
    # Fields without a column of their own travel in extra["_record"] for a lossless export.
    rest = {k: e[k] for k in _RESULT_RECORD_ONLY if e.get(k) is not None and k != "case_id"}
    # A non-finite error keeps the record's spelling ("nan", "inf", "-inf") here as well:
    # its column holds the float, and SQLite stores a NaN as NULL (the export reads it back
    # from here, so what is written is what was stored).
    err_rest = {k: v for k, v in errors.items()
                if k not in ("out_err", "base_err", "ratio", "lse_err")
                or (isinstance(v, str) and v in ("nan", "inf", "-inf"))}
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
        "pass_name": entry_pass(e),
    }


def store_record(db: Database, record: RunRecord, origin: Origin | None = None) -> int:
    """Store a run record; returns its run id. Idempotent on `record.uuid`. `origin`
    defaults to this machine's own run, trusted, named after the record's source."""
    return store_records(db, [record], origin)[0][0]


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]


def store_records(db: Database, records: Sequence[RunRecord], origin: Origin | None = None
                  ) -> list[tuple[int, bool]]:
    """Store several records in one transaction: all, or none (a conflict or a refusal of
    any of them rolls back the others). Returns (run id, newly stored) per record. A
    record already stored untrusted becomes trusted when stored again by a trusted
    `origin` (the operator vouching for it); a trusted one never loses its trust."""
    for record in records:
        record.check()
    current = records[0] if records else None
    try:
        with db.session() as s:
            out = []
            for record in records:
                current = record
                out.append(_store(s, db.dialect, record,
                                  origin or local_origin(record.source)))
            return out
    except DatabaseError:
        raise
    except OperationalError as exc:
        raise DatabaseUnavailable(f"database {db.display_url}: {_reason(exc)}") from None
    except (DBAPIError, SQLAlchemyError) as exc:
        what = f"run {current.uuid}" if current is not None else "records"
        raise RecordRefused(f"{what} refused by the database: {_reason(exc)}") from None


def _store(s: Session, dialect: str, record: RunRecord, origin: Origin
           ) -> tuple[int, bool]:
    sha = record.sha256()
    known = select(Run.id, Run.record_sha256, Run.trusted).where(Run.uuid == record.uuid)
    existing = s.execute(known).first()
    if existing is None:
        stmt = _insert_ignore(dialect, Run.__table__).values(**_run_row(record, sha, origin))
        run_id = s.execute(stmt.returning(Run.__table__.c.id)).scalar()
        if run_id is None:  # a concurrent writer stored the same record just now
            existing = s.execute(known).first()
    if existing is not None:
        if existing.record_sha256 != sha:
            raise RecordConflict(f"run {record.uuid} is already stored with different "
                                 f"content (run id {existing.id}); not storing it again")
        if origin.trusted and not existing.trusted:
            s.execute(Run.__table__.update().where(Run.__table__.c.id == existing.id)
                      .values(trusted=True, origin=origin.label))
        return int(existing.id), False

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
        case_rows.append({"case_id": c.id, **c.columns()})
    cids = _get_or_create(s, CaseRow, ("case_id",), case_rows)
    rows = []
    for e in record.results:
        info = record.kernels.get(e["kernel"]) or {}
        vid = vids[(e["kernel"], info.get("source_hash") or "")]
        rows.append(_result_row(e, run_id, vid, cids[(Case.from_dict(e["case"]).id,)]))
    if rows:
        s.execute(insert(Result.__table__), rows)
    return int(run_id), True


def store_comparisons(db: Database, run_id: int, base_run_id: int | None,
                      verdicts: Sequence[Any], base_ids: dict[str, int] | None = None) -> int:
    """Store regression verdicts (objects with variant, case_id, verdict, ratio, p_value,
    detail) of `run_id` against its baseline; earlier verdicts of `run_id` against the
    same base runs are replaced. Each verdict is stored against the base run whose entry
    it was judged on (`v.base_uuid`, looked up in `base_ids`: uuid -> run id), else
    `base_run_id`: a pooled window's newest run may not hold that candidate at all."""
    ids = base_ids or {}

    def base_of(v: Any) -> int | None:
        return ids.get(getattr(v, "base_uuid", None) or "", base_run_id)

    used = {base_of(v) for v in verdicts} | {base_run_id}
    with db.session() as s:
        known = [i for i in used if i is not None]
        cond = Comparison.base_run_id.in_(known) if known else None
        if None in used:
            cond = (Comparison.base_run_id.is_(None) if cond is None
                    else or_(cond, Comparison.base_run_id.is_(None)))
        s.execute(Comparison.__table__.delete().where(and_(Comparison.run_id == run_id, cond)))
        rows = [{"run_id": run_id, "base_run_id": base_of(v), "variant": v.variant,
                 "case_id": v.case_id, "verdict": v.verdict, "ratio": v.ratio,
                 "p_value": v.p_value, "detail": v.detail,
                 "pass_name": getattr(v, "pass_name", "fwd"),
                 "created_at": parse_time(_now())} for v in verdicts]
        if rows:
            s.execute(insert(Comparison.__table__), rows)
    return len(rows)


def _now() -> str:
    from harness.records.record import utc_now_iso

    return utc_now_iso()


def import_spool(db: Database, directory: str | Path | None = None, *,
                 waiting: list[str] | None = None,
                 judge: Callable[[Database, int], object] | None = None
                 ) -> tuple[list[int], list[str]]:
    """Store every spooled record meant for this database, oldest first; stored ones leave
    the spool. `judge(db, run_id)` (the verdicts of the run) runs in the transaction that
    stores the run: a run is stored with them or not at all.
    A record that cannot be stored (invalid, conflicting, refused by the database) is set
    aside in `<spool>/rejected/` with its reason, and the others go on; a record spooled
    for another database waits for it. Returns (run ids, one line per record not stored).
    Records waiting for another database are listed in `waiting` when given (else among the
    problems). Raises DatabaseUnavailable when the database goes away (nothing more is
    moved)."""
    from harness.records.record import RecordError, set_aside, spool_target, spooled

    ids, problems = [], []
    ready: list[tuple[Path, RunRecord]] = []
    for path in spooled(directory):
        target = spool_target(path)
        if target is not None and target != db.display_url:
            (problems if waiting is None else waiting).append(
                f"{path}: waiting for its database {target}")
            continue
        try:
            ready.append((path, RunRecord.read(path)))
        except RecordError as exc:
            problems.append(f"{path}: set aside in {set_aside(path, str(exc)).parent}: {exc}")
    for path, record in sorted(ready, key=lambda pr: (pr[1].created, pr[1].uuid)):
        try:
            # The spool holds what this machine's own runs wrote while their database
            # was away: their origin is this machine, trusted as the runs themselves.
            with db.transaction():
                run_id = store_record(db, record, local_origin(f"{record.source} spool"))
                if judge is not None:
                    judge(db, run_id)
            ids.append(run_id)
        except DatabaseUnavailable:
            raise
        except (RecordError, DatabaseError) as exc:
            problems.append(f"{path}: set aside in {set_aside(path, str(exc)).parent}: {exc}")
            continue
        path.unlink(missing_ok=True)
        path.with_suffix(".target").unlink(missing_ok=True)
    return ids, problems


__all__ = [
    "Database", "DatabaseError", "DatabaseUnavailable", "RecordConflict", "RecordRefused",
    "baseline_runs", "counts", "get_run", "history", "import_spool", "latest_run",
    "load_record", "open_db", "ping", "recent_runs", "store_comparisons", "store_record",
    "store_records", "Origin", "local_origin", "who",
]
