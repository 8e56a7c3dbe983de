"""Validation of a run record: every problem found, as readable lines naming the field, so
a bad record is refused with what is wrong instead of being stored half-right.

First the sizes (`FIELD_LIMITS`, `MAX_STRING`, documented in docs/record-format.md): a
record is stored whole, and every byte of it can reach a dashboard page, so one field of
60 MB is refused with one line naming it, before anything else is walked.

Then one validation for every database: the JSON Schema the record format publishes
(`record-schema-v1.json` in this package, `schema()`; types, required keys, the column
lengths and integer ranges of the database; checked by fastjsonschema's compiled code,
and by jsonschema for the messages of a record it refuses: `schema_errors`), then `jsonio.value_problems` (what JSON Schema
cannot say: non-finite numbers, integers outside 64 bits, NUL characters, nesting depth),
then the checks that need the harness itself (a valid UUID and time, a valid `Case`, a
`case_id` that matches it, no two entries for one kernel, pass and case).
"""

from __future__ import annotations

import json
import re
import uuid as uuidlib
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

from harness.core.cases import Case
from harness.records.jsonio import value_problems

SUPPORTED_VERSIONS = frozenset({1})
RUN_SOURCES = ("ci", "cli", "import", "submission", "benchmark")
ERROR_KEYS = ("out_err", "base_err", "floor", "ratio", "lse_err", "lse_base_err", "worst_index")
SCHEMA_FILE = "record-schema-v1.json"

KiB = 1024
MiB = 1024 * KiB
# The most bytes (compact JSON, UTF-8) a field of a record may take. The committed records
# use at most a tenth of each (env: the gate's plan, 37 KiB; a result's samples: 90 KiB).
FIELD_LIMITS = {
    "env": 1 * MiB, "gpu": 64 * KiB, "calibration": 256 * KiB, "grids": 64 * KiB,
    "kernels.*": 1 * MiB,  # each candidate's entry (a CUDA variant's manifest)
    "results[*].extra": 256 * KiB, "results[*].samples_ms": 2 * MiB,
    "results[*].errors": 64 * KiB, "results[*].bytes": 64 * KiB,
}
# A candidate's name, matched whole: what every candidate kind allows (letters, digits,
# '_', '-'; a benchmark file's names may add '.', ':', '+', '@', '/'), never a control
# character, a space, markup or a trailing newline: names are shown on every page and log.
KERNEL_NAME = re.compile(r"\w[\w.:+@/\-]{0,254}\Z")
# Any one string anywhere in a record (a message, a hostname, an argv entry, a key).
MAX_STRING = 64 * KiB
MAX_RESULTS = 1_000_000
MAX_KERNELS = 10_000


def parse_time(value: str) -> datetime:
    """ISO 8601 timestamp -> aware UTC datetime (naive values are taken as UTC)."""
    dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def canonical_uuid(value: str) -> str:
    """The one spelling of a UUID that is stored: lowercase, hyphenated (an uppercase or
    braced copy of a stored record is the same run). Raises ValueError."""
    return str(uuidlib.UUID(str(value)))


@cache
def schema() -> dict[str, Any]:
    """The published JSON Schema of schema_version 1."""
    return json.loads(resources.files("harness.records").joinpath(SCHEMA_FILE).read_text())


@cache
def _validator() -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(schema())


@cache
def _fast_check() -> Any:
    """The same schema compiled to Python code by fastjsonschema, which says valid or not
    (its first error only) about 25 times faster than jsonschema's walk: a valid record,
    the common case, is walked once by it; only a record it refuses is walked by
    `_validator()`, whose errors, all of them, are what the user reads (and whose word
    stands where the two differ). fastjsonschema knows drafts 4 to 7: the schema uses
    nothing of 2020-12 that draft 7 lacks ($defs is a plain JSON pointer there), which
    tests/test_record_hostile.py holds the two to on hostile records."""
    import fastjsonschema

    return fastjsonschema.compile(
        {**schema(), "$schema": "http://json-schema.org/draft-07/schema#"})


def schema_errors(data: Any) -> list[Any]:
    """jsonschema's errors of `data` against the published schema, in field order; none
    without walking it with jsonschema when the compiled check passes it."""
    from fastjsonschema import JsonSchemaException

    try:
        _fast_check()(data)
        return []
    except JsonSchemaException:
        return sorted(_validator().iter_errors(data),
                      key=lambda e: [str(p) for p in e.absolute_path])


def _where(path: Any) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
               float: "number", type(None): "null"}


def _message(err: Any) -> str:
    """One line per schema error, in the words of the record format, never a long echo."""
    where = _where(err.absolute_path)
    kind, arg = err.validator, err.validator_value
    if kind == "required":
        missing = [k for k in arg if isinstance(err.instance, dict) and k not in err.instance]
        return "; ".join(f"{where + '.' if where else ''}{k}: missing" for k in missing)
    where = where or "record"
    if kind == "type":
        kinds = arg if isinstance(arg, list) else [arg]
        got = _JSON_TYPES.get(type(err.instance), type(err.instance).__name__)
        return f"{where}: must be {' or '.join(kinds)}, not {got}"
    if kind == "maxLength":
        return f"{where}: longer than {arg} characters"
    if kind == "minLength":
        return f"{where}: must not be empty"
    if kind in ("minimum", "maximum"):
        return f"{where}: {_short(err.instance)} is out of range ({kind} {arg})"
    if kind in ("enum", "const"):
        allowed = arg if isinstance(arg, list) else [arg]
        return f"{where}: {_short(err.instance)} is not one of {', '.join(map(str, allowed))}"
    if kind == "additionalProperties":
        known = set(err.schema.get("properties", {}))
        extra = sorted(k for k in err.instance if k not in known)
        return f"{where}: unknown key(s) {', '.join(_short(k) for k in extra[:5])}"
    return f"{where}: {err.message[:120]}"


def _semantic(data: dict[str, Any], problems: list[str]) -> None:
    try:
        canonical_uuid(data["uuid"])
    except ValueError:
        problems.append(f"uuid: {_short(data['uuid'])} is not a UUID")
    try:
        parse_time(data["created_at"])
    except ValueError:
        problems.append(f"created_at: {_short(data['created_at'])} is not an ISO 8601 time")
    for name in data.get("kernels") or {}:
        if not KERNEL_NAME.match(name):
            problems.append(f"kernels: {_short(name)} is not a candidate name (letters, "
                            "digits and _-.:+@/)")
    seen: dict[str, int] = {}
    for i, e in enumerate(data["results"]):
        if not KERNEL_NAME.match(e["kernel"]):
            problems.append(f"results[{i}].kernel: {_short(e['kernel'])} is not a candidate "
                            "name (letters, digits and _-.:+@/)")
            continue
        try:
            case_id = Case.from_dict(e["case"]).id
        except (ValueError, TypeError) as exc:
            problems.append(f"results[{i}].case: {exc}")
            continue
        if e.get("case_id") not in (None, case_id):
            problems.append(f"results[{i}].case_id: {_short(e['case_id'])} does not match "
                            f"case ({case_id})")
        pass_name = e.get("pass") or "fwd"
        key = f"{e['kernel']}|{pass_name}|{case_id}"
        if key in seen:
            problems.append(f"results[{i}]: duplicate of results[{seen[key]}] "
                            f"(kernel, pass and case {e['kernel']}, {pass_name}, {case_id})")
        seen.setdefault(key, i)


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                          default=str).encode())


def _long_strings(data: Any, limit: int = 3) -> list[str]:
    """Strings (values or keys) longer than MAX_STRING, walked without recursion."""
    out: list[str] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack and len(out) < limit:
        value, path = stack.pop()
        if isinstance(value, str):
            if len(value) > MAX_STRING // 4 and len(value.encode()) > MAX_STRING:
                out.append(f"{_where(path) or 'record'}: a string of {len(value.encode())} "
                           f"bytes, more than the limit of {MAX_STRING}")
        elif isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and len(k.encode()) > MAX_STRING:
                    out.append(f"{_where(path) or 'record'}: a key of {len(k.encode())} "
                               f"bytes, more than the limit of {MAX_STRING}")
                stack.append((v, (*path, k)))
        elif isinstance(value, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(value))
    return out


def size_problems(data: dict[str, Any], limit: int = 3) -> list[str]:
    """Fields of `data` over their limits (FIELD_LIMITS, MAX_STRING), each naming the
    field, its size and the limit; [] when every field fits."""
    out: list[str] = []

    def check(where: str, key: str, value: Any) -> None:
        n = _size(value)
        if n > FIELD_LIMITS[key]:
            out.append(f"{where}: {n} bytes, more than the limit of {FIELD_LIMITS[key]} "
                       "for this field")

    for key in ("env", "gpu", "calibration", "grids"):
        if data.get(key) is not None:
            check(key, key, data[key])
    kernels, results = data.get("kernels"), data.get("results")
    if isinstance(kernels, dict):
        if len(kernels) > MAX_KERNELS:
            out.append(f"kernels: {len(kernels)} entries, more than the limit of "
                       f"{MAX_KERNELS}")
        for name, info in list(kernels.items())[:MAX_KERNELS]:
            check(f"kernels.{_short(name)}", "kernels.*", info)
    if isinstance(results, list):
        if len(results) > MAX_RESULTS:
            out.append(f"results: {len(results)} entries, more than the limit of "
                       f"{MAX_RESULTS}")
        for i, e in enumerate(results[:MAX_RESULTS]):
            if len(out) >= limit:
                break
            if isinstance(e, dict):
                for key in ("extra", "samples_ms", "errors", "bytes"):
                    if e.get(key) is not None:
                        check(f"results[{i}].{key}", f"results[*].{key}", e[key])
    return (out + _long_strings(data))[:limit]


def validate(data: Any) -> list[str]:
    """Every problem of a record dict, each naming its field; [] when valid."""
    if not isinstance(data, dict):
        return [f"record: expected a JSON object, got {type(data).__name__}"]
    if "schema_version" not in data:
        return ["schema_version: missing (not a fa-harness run record?)"]
    version = data["schema_version"]
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        return [f"schema_version: unknown version {_short(version)} "
                f"(this fa-harness reads {', '.join(map(str, sorted(SUPPORTED_VERSIONS)))})"]
    problems = value_problems(data)
    if problems:  # the structure itself is unsafe to walk further
        return problems
    problems = size_problems(data)
    if problems:  # too large to store or show: nothing else matters
        return problems
    problems = [m for m in (_message(e) for e in schema_errors(data)) if m]
    if not problems:
        _semantic(data, problems)
    return problems
