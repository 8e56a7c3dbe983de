"""Reading JSON that someone else wrote: bounded, strict, and the same on every database.

The standard library accepts what no database stores the same way: `NaN` / `Infinity`
literals (SQLite keeps them, PostgreSQL refuses them), integers of any size (PostgreSQL
BIGINT stops at 64 bits), NUL characters (PostgreSQL text refuses them), and nesting deep
enough to end in a RecursionError. It also reads whatever it is given: `/dev/zero` until
memory runs out, a FIFO until someone writes to it. Every record the harness reads from a
file goes through `read_json`; every record it validates, from a file or built in memory,
through `value_problems`.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

# The largest record file read (the committed H200 records are about 1 MiB each).
MAX_BYTES = 64 * 2**20
MAX_DEPTH = 64
INT64 = (-(2**63), 2**63 - 1)


class JsonInputError(ValueError):
    """A file that cannot be read as JSON here; the message is one line naming it."""


def read_text(path: str | Path, max_bytes: int = MAX_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise JsonInputError(f"{path}: no such file") from None
    except OSError as e:
        raise JsonInputError(f"{path}: cannot open ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise JsonInputError(f"{path}: not a regular file")
        if st.st_size > max_bytes:
            raise JsonInputError(f"{path}: {st.st_size} bytes, more than the limit of "
                                 f"{max_bytes}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)  # a file still growing is cut here, not read on
    except OSError as e:
        raise JsonInputError(f"{path}: cannot read ({e.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise JsonInputError(f"{path}: more than the limit of {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JsonInputError(f"{path}: not UTF-8 (byte {e.start})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (write non-finite numbers as \"nan\", \"inf\")")


def loads(text: str) -> Any:
    """json.loads without NaN/Infinity literals and without a RecursionError."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise JsonInputError(f"not JSON ({e.msg} at line {e.lineno} column {e.colno})"
                             ) from None
    except ValueError as e:
        if "integer string conversion" in str(e):  # CPython's limit on digits
            raise JsonInputError("not JSON this harness reads: an integer literal with "
                                 "thousands of digits") from None
        raise JsonInputError(str(e)) from None
    except RecursionError:
        raise JsonInputError("not JSON this harness reads: nested too deeply") from None


def read_json(path: str | Path, max_bytes: int = MAX_BYTES) -> tuple[str, Any]:
    """(text, value) of a JSON file, both bounded; JsonInputError names the problem."""
    text = read_text(path, max_bytes)
    try:
        return text, loads(text)
    except JsonInputError as e:
        raise JsonInputError(f"{path}: {e}") from None


def _where(path: tuple[Any, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "record"


def value_problems(data: Any, max_depth: int = MAX_DEPTH, limit: int = 5) -> list[str]:
    """What in `data` no database stores faithfully: nesting deeper than `max_depth`,
    non-finite floats, integers outside 64 bits, NUL characters (walked without recursion)."""
    problems: list[str] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack and len(problems) < limit:
        value, path = stack.pop()
        if len(path) > max_depth:
            problems.append(f"{_where(path[:3])}...: nested more than {max_depth} levels")
            continue
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str) or "\x00" in k:
                    problems.append(f"{_where(path)}: a key that is not a plain string")
                    continue
                stack.append((v, (*path, k)))
        elif isinstance(value, list | tuple):
            stack.extend((v, (*path, i)) for i, v in enumerate(value))
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not INT64[0] <= value <= INT64[1]:
                problems.append(f"{_where(path)}: integer outside 64 bits")
        elif isinstance(value, float):
            if not math.isfinite(value):
                problems.append(f"{_where(path)}: {value} is not a JSON number")
        elif isinstance(value, str):
            if "\x00" in value:
                problems.append(f"{_where(path)}: contains a NUL character")
        else:
            problems.append(f"{_where(path)}: {type(value).__name__} is not a JSON value")
    return problems
