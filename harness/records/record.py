"""Versioned JSON run records: what one harness run measured, as a diffable text file.

Every run writes its record first and stores it in the database second, so a run whose
database is unreachable loses nothing: the record waits in the spool directory (next to
the default database) until a later run or `fa-harness import` loads it. The committed
H200 history under `results/` is made of these files. The format is documented in
docs/record-format.md; `SCHEMA_VERSION` changes with any incompatible change.

Files are written with indent=1 and sorted keys (stable diffs), atomically (a temporary
file renamed into place), and only after validation: an invalid record is never written.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import uuid as uuidlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.core.cases import Case
from harness.core.results import CaseResult, Errors, Status, Timing
from harness.records.jsonio import JsonInputError, read_json
from harness.records.provenance import environment, git_metadata
from harness.records.spool import set_aside, spool, spool_target, spooled
from harness.records.validate import (
    ERROR_KEYS,
    SUPPORTED_VERSIONS,
    canonical_uuid,
    parse_time,
    validate,
)

SCHEMA_VERSION = 1
MAX_MESSAGE = 8192  # characters of a result's message a record keeps
BYTES_KEYS = ("model", "ideal", "read", "write")
__all__ = ["RecordError", "RunRecord", "gpu_model_key", "iso_utc", "parse_time", "spool",
           "spooled", "spool_target", "set_aside", "utc_now_iso", "validate", "SCHEMA_VERSION", "SUPPORTED_VERSIONS"]


class RecordError(ValueError):
    """A record that cannot be read, or does not validate. The message names the field."""


# --------------------------------------------------------------------------- helpers


def utc_now_iso() -> str:
    return iso_utc(datetime.now(UTC))


def iso_utc(dt: datetime) -> str:
    """The one timestamp spelling of records: UTC, microseconds, 'Z'."""
    return dt.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")



def gpu_model_key(name: str | None) -> str:
    """The key of "same kind of GPU" (harness.measure.gpuinfo's slug of the name); runs are only
    ever compared within one key. No GPU at all -> "cpu"."""
    if not name:
        return "cpu"
    from harness.measure.gpuinfo import gpu_model_key as slug

    return slug(name)


def _json_number(x: Any) -> Any:
    """JSON has no NaN/inf: keep them as strings so nothing is silently changed."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def json_safe(x: Any) -> Any:
    """`_json_number` through nested dicts and lists (a result's `extra`, such as the
    backward's per-gradient errors, where an infinite error ratio is a real verdict)."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return _json_number(x)


def _from_json_number(x: Any) -> Any:
    if isinstance(x, str) and x in ("nan", "inf", "-inf"):
        return float(x)
    return x



# --------------------------------------------------------------------------- entries


def entry_from_result(r: CaseResult, kernel_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """One record result entry from a CaseResult (flat timing fields, grouped errors/bytes)."""
    t = r.timing or Timing()
    extra = dict(r.extra or {})
    if t.sm_clock_mhz is not None:  # no column of its own: the schema's extra holds it
        extra["sm_clock_mhz"] = round(float(t.sm_clock_mhz), 1)
    info = kernel_info or {}

    def res(key: str) -> Any:  # compile resources: per result when given, else per kernel
        return extra.pop(key, info.get(key))

    pass_name = str(extra.pop("pass", "fwd"))
    return {
        "kernel": r.kernel,
        "case": r.case.to_dict(),
        "case_id": r.case.id,
        "pass": pass_name,
        "status": Status(r.status).value,
        "message": _clip(r.message or ""),
        "errors": {k: _json_number(v) for k, v in asdict(r.errors).items()},
        "samples_ms": [float(s) for s in t.samples_ms],
        "median_ms": t.median_ms,
        "min_ms": t.min_ms,
        "iqr_ms": t.iqr_ms,
        "rel_noise": t.rel_noise,
        "dropped_throttled": t.dropped_throttled,
        "timing_mode": t.mode if r.timing else None,
        "timing_method": t.method if r.timing else None,
        "flops": r.flops,
        "tflops": r.tflops,
        "bytes": {"model": r.bytes_model, "ideal": r.bytes_ideal,
                  "read": r.bytes_measured_read, "write": r.bytes_measured_write},
        "registers": res("registers"),
        "spills": res("spills"),
        "shared_bytes": res("shared_bytes"),
        "extra": json_safe(extra),
    }


def _clip(text: str, limit: int = MAX_MESSAGE) -> str:
    """A message cut to `limit` characters, saying how much was cut: a compiler's or a
    crashed child's output must not make the run's own record too large to write
    (harness.records.validate.MAX_STRING)."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"... ({len(text) - limit} more characters)"


def entry_pass(e: dict[str, Any]) -> str:
    """The pass of a record entry: "fwd" or "bwd". Records written before the backward
    existed have no "pass": they are forward results."""
    return str(e.get("pass") or "fwd")


def result_from_entry(e: dict[str, Any]) -> CaseResult:
    errors = {k: _from_json_number(v) for k, v in (e.get("errors") or {}).items()
              if k in ERROR_KEYS}
    timing = None
    if e.get("samples_ms") or e.get("median_ms") is not None:
        timing = Timing(samples_ms=list(e.get("samples_ms") or []), median_ms=e.get("median_ms"),
                        min_ms=e.get("min_ms"), iqr_ms=e.get("iqr_ms"),
                        rel_noise=e.get("rel_noise"),
                        dropped_throttled=e.get("dropped_throttled") or 0,
                        mode=e.get("timing_mode") or "cold", method=e.get("timing_method") or "")
    b = e.get("bytes") or {}
    extra = dict(e.get("extra") or {})
    clock = extra.pop("sm_clock_mhz", None)
    if timing is not None and isinstance(clock, int | float):
        timing.sm_clock_mhz = float(clock)
    for k in ("registers", "spills", "shared_bytes"):
        if e.get(k) is not None:
            extra[k] = e[k]
    if entry_pass(e) != "fwd":
        extra["pass"] = entry_pass(e)
    return CaseResult(kernel=e["kernel"], case=Case.from_dict(e["case"]),
                      status=Status(e["status"]), message=e.get("message") or "",
                      errors=Errors(**errors), timing=timing, flops=e.get("flops"),
                      tflops=e.get("tflops"), bytes_model=b.get("model"),
                      bytes_ideal=b.get("ideal"), bytes_measured_read=b.get("read"),
                      bytes_measured_write=b.get("write"), extra=extra)


# --------------------------------------------------------------------------- the record


@dataclass
class RunRecord:
    uuid: str
    created_at: str
    commit: str | None
    gpu: dict[str, Any] | None
    results: list[dict[str, Any]]
    parent: str | None = None
    branch: str | None = None
    source: str = "cli"
    env: dict[str, Any] = field(default_factory=dict)
    calibration: dict[str, Any] | None = None
    grids: list[str] = field(default_factory=list)
    # Per kernel: kind, source_hash, manifest, compile resources (registers, spills, ...).
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    # The content hash (sha256()) of the form last found valid: check() revalidates only
    # a record changed since, since the schema walk is most of what importing a record
    # costs.
    _valid_sha: str | None = field(default=None, init=False, repr=False, compare=False)

    # ---- construction

    @classmethod
    def from_results(cls, results: Iterable[CaseResult], meta: dict[str, Any] | None = None,
                     ) -> RunRecord:
        """A new record (fresh uuid, now) from results and run metadata. `meta` keys:
        source, grids, gpu, env, calibration, kernels, commit, parent, branch, created_at,
        uuid; git metadata and the environment are collected when not given."""
        meta = dict(meta or {})
        git = (git_metadata() if any(k not in meta for k in ("commit", "parent", "branch"))
               else {})
        env = meta.get("env")
        if env is None:
            env = environment()
            if git.get("dirty") is not None:
                env["git_dirty"] = git["dirty"]
            if git.get("repository_url"):
                env["repository_url"] = git["repository_url"]
        kernels = {k: dict(v) for k, v in (meta.get("kernels") or {}).items()}
        entries = [entry_from_result(r, kernels.get(r.kernel)) for r in results]
        for e in entries:
            kernels.setdefault(e["kernel"], {})
        gpu = meta.get("gpu")
        if gpu is not None:
            gpu = dict(gpu)
            gpu.setdefault("model_key", gpu_model_key(gpu.get("name")))
        rec = cls(uuid=canonical_uuid(meta.get("uuid") or uuidlib.uuid4()),
                  created_at=iso_utc(parse_time(meta["created_at"])) if meta.get("created_at")
                  else utc_now_iso(),
                  commit=meta.get("commit", git.get("commit")),
                  parent=meta.get("parent", git.get("parent")),
                  branch=meta.get("branch", git.get("branch")),
                  source=meta.get("source", "cli"), gpu=gpu, env=env,
                  calibration=meta.get("calibration"), grids=list(meta.get("grids") or []),
                  kernels=kernels, results=entries)
        rec.check()
        return rec

    @classmethod
    def from_dict(cls, data: Any) -> RunRecord:
        problems = validate(data)
        if problems:
            raise RecordError(_summarise(problems))
        entries = []
        for e in data["results"]:
            e = dict(e)
            e.setdefault("case_id", Case.from_dict(e["case"]).id)
            entries.append(e)
        rec = cls(uuid=canonical_uuid(data["uuid"]),
                   created_at=iso_utc(parse_time(data["created_at"])),
                   commit=data["commit"], gpu=data["gpu"], results=entries,
                   parent=data.get("parent"), branch=data.get("branch"),
                   source=data.get("source", "cli"), env=dict(data.get("env") or {}),
                   calibration=data.get("calibration"), grids=list(data.get("grids") or []),
                   kernels={k: dict(v) for k, v in (data.get("kernels") or {}).items()},
                   schema_version=int(data["schema_version"]))
        # What was validated is exactly this record's form (no field was filled in or
        # respelled): remember it as valid.
        if rec.to_dict() == data:
            rec._valid_sha = rec._content_sha()
        return rec

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version, "uuid": self.uuid,
            "created_at": self.created_at, "source": self.source, "commit": self.commit,
            "parent": self.parent, "branch": self.branch, "gpu": self.gpu, "env": self.env,
            "calibration": self.calibration, "grids": self.grids, "kernels": self.kernels,
            "results": self.results,
        }

    def check(self) -> None:
        sha = self._content_sha()
        if sha is not None and sha == self._valid_sha:
            return
        problems = validate(self.to_dict())
        if problems:
            raise RecordError(_summarise(problems))
        self._valid_sha = sha

    def _content_sha(self) -> str | None:
        """sha256(), or None for a record whose content has no canonical form (a float
        that is not finite, an object JSON cannot hold): validation says what is wrong."""
        try:
            return self.sha256()
        except (TypeError, ValueError):
            return None

    def with_results(self, entries: list[dict[str, Any]]) -> RunRecord:
        """This record with `entries` as its results (validated)."""
        from dataclasses import replace

        rec = replace(self, results=[dict(e) for e in entries])
        for e in rec.results:
            rec.kernels.setdefault(e["kernel"], {})
        rec.check()
        return rec

    # ---- derived values

    @property
    def gpu_model_key(self) -> str:
        gpu = self.gpu or {}
        return gpu.get("model_key") or gpu_model_key(gpu.get("name"))

    @property
    def created(self) -> datetime:
        return parse_time(self.created_at)

    def case_results(self) -> list[CaseResult]:
        return [result_from_entry(e) for e in self.results]

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True, allow_nan=False) + "\n"

    def sha256(self) -> str:
        """Content hash of the canonical form (the stored record_sha256)."""
        canon = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"),
                           allow_nan=False)
        return hashlib.sha256(canon.encode()).hexdigest()

    # ---- files

    def write(self, path: str | Path) -> Path:
        """Validate, then write atomically; an invalid record writes nothing."""
        self.check()
        text = self.dumps()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def read(cls, path: str | Path) -> RunRecord:
        """A record file: a regular file of bounded size, strict JSON, validated."""
        try:
            _, data = read_json(path)
        except JsonInputError as exc:
            raise RecordError(str(exc)) from None
        try:
            return cls.from_dict(data)
        except RecordError as exc:
            raise RecordError(f"{path}: {exc}") from None


def _summarise(problems: list[str], limit: int = 5) -> str:
    head = "; ".join(problems[:limit])
    more = len(problems) - limit
    return head + (f"; and {more} more problem(s)" if more > 0 else "")


def looks_like_record(data: Any) -> bool:
    return isinstance(data, dict) and "schema_version" in data and "results" in data
