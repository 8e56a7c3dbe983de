"""Validation of a run record as read from JSON: every problem found, as readable lines, so a
bad file is refused with what is wrong instead of being stored half-right.
"""

from __future__ import annotations

import math
import uuid as uuidlib
from datetime import UTC, datetime
from typing import Any

from harness.core.cases import Case
from harness.core.results import Status


def parse_time(value: str) -> datetime:
    """ISO 8601 timestamp -> aware UTC datetime (naive values are taken as UTC)."""
    dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)



SUPPORTED_VERSIONS = frozenset({1})
RUN_SOURCES = ("ci", "cli", "import", "submission", "benchmark")
# Keys every record / every result entry must carry (values may be null where noted in
# docs/record-format.md: commit and gpu are null without git / without a GPU).
REQUIRED_RUN_KEYS = ("schema_version", "uuid", "created_at", "commit", "gpu", "results")
REQUIRED_RESULT_KEYS = ("kernel", "case", "status", "samples_ms", "median_ms", "tflops")
ERROR_KEYS = ("out_err", "base_err", "floor", "ratio", "lse_err", "lse_base_err", "worst_index")


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


# --------------------------------------------------------------------------- validation


def _check_entry(i: int, e: Any, problems: list[str]) -> str | None:
    where = f"results[{i}]"
    if not isinstance(e, dict):
        problems.append(f"{where}: expected an object, got {type(e).__name__}")
        return None
    for key in REQUIRED_RESULT_KEYS:
        if key not in e:
            problems.append(f"{where}.{key}: missing")
    if not isinstance(e.get("kernel", ""), str) or ("kernel" in e and not e["kernel"]):
        problems.append(f"{where}.kernel: must be a non-empty string")
    case_id = None
    if isinstance(e.get("case"), dict):
        try:
            case_id = Case.from_dict(e["case"]).id
        except (ValueError, TypeError) as exc:
            problems.append(f"{where}.case: {exc}")
        if case_id and e.get("case_id") not in (None, case_id):
            problems.append(f"{where}.case_id: {e['case_id']!r} does not match case ({case_id})")
    elif "case" in e:
        problems.append(f"{where}.case: expected an object with the case fields")
    if "status" in e and e["status"] not in {s.value for s in Status}:
        problems.append(f"{where}.status: {e['status']!r} is not one of "
                        f"{', '.join(s.value for s in Status)}")
    if "samples_ms" in e:
        s = e["samples_ms"]
        if not isinstance(s, list) or not all(_is_number(x) and math.isfinite(x) and x >= 0
                                              for x in s):
            problems.append(f"{where}.samples_ms: must be a list of finite times >= 0")
    for key in ("median_ms", "tflops", "min_ms", "iqr_ms", "rel_noise"):
        if e.get(key) is not None and not _is_number(e[key]):
            problems.append(f"{where}.{key}: must be a number or null")
    for key in ("errors", "bytes", "extra"):
        if e.get(key) is not None and not isinstance(e[key], dict):
            problems.append(f"{where}.{key}: must be an object")
    if isinstance(e.get("errors"), dict):
        unknown = set(e["errors"]) - set(ERROR_KEYS)
        if unknown:
            problems.append(f"{where}.errors: unknown key(s) {', '.join(sorted(unknown))}")
    return f"{e.get('kernel')}|{case_id}" if case_id else None


def validate(data: Any) -> list[str]:
    """Every problem of a record dict, each naming its field; [] when valid."""
    if not isinstance(data, dict):
        return [f"record: expected a JSON object, got {type(data).__name__}"]
    problems: list[str] = []
    version = data.get("schema_version")
    if "schema_version" not in data:
        return ["schema_version: missing (not a fa-harness run record?)"]
    if version not in SUPPORTED_VERSIONS:
        return [f"schema_version: unknown version {version!r} "
                f"(this fa-harness reads {', '.join(map(str, sorted(SUPPORTED_VERSIONS)))})"]
    for key in REQUIRED_RUN_KEYS:
        if key not in data:
            problems.append(f"{key}: missing")
    if "uuid" in data:
        try:
            uuidlib.UUID(str(data["uuid"]))
        except ValueError:
            problems.append(f"uuid: {data['uuid']!r} is not a UUID")
    if "created_at" in data:
        try:
            parse_time(str(data["created_at"]))
        except ValueError:
            problems.append(f"created_at: {data['created_at']!r} is not an ISO 8601 time")
    for key in ("commit", "parent", "branch"):
        if data.get(key) is not None and not isinstance(data[key], str):
            problems.append(f"{key}: must be a string or null")
    if data.get("gpu") is not None and not isinstance(data["gpu"], dict):
        problems.append("gpu: must be an object or null")
    if data.get("source", "cli") not in RUN_SOURCES:
        problems.append(f"source: {data['source']!r} is not one of {', '.join(RUN_SOURCES)}")
    for key in ("env", "kernels"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            problems.append(f"{key}: must be an object")
    if data.get("grids") is not None and not isinstance(data["grids"], list):
        problems.append("grids: must be a list")
    results = data.get("results")
    if "results" in data and not isinstance(results, list):
        problems.append("results: must be a list")
    elif isinstance(results, list):
        seen: dict[str, int] = {}
        for i, e in enumerate(results):
            key = _check_entry(i, e, problems)
            if key is not None:
                if key in seen:
                    problems.append(f"results[{i}]: duplicate of results[{seen[key]}] "
                                    f"(kernel and case {key.replace('|', ', ')})")
                seen.setdefault(key, i)
    return problems
