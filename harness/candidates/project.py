"""`[tool.fa-harness]` of a team's pyproject.toml, read and validated.

The table of the `pyproject.toml` in the current directory or its nearest parent names the
team's kernel folders (`kernels-dirs`), Python candidates (`candidates`), the candidates
it brings for comparison only (`yardsticks`: names or globs; timed and reported, never
the team's, never a failure) and the gate's floor and target of timed cases per owned
candidate (`timing-min`, `timing-cases`). A
key the harness does not know, a value of the wrong type, or a table whose name is close
to it (`[tool.fa_harness]`, `[tool.fa-harnes]`) is a `DiscoveryError` naming what is
known: a misspelt setting must never read as "no configuration", which made a team's
variants vanish without a word.
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path

TABLE = "fa-harness"
LIST_KEYS = ("kernels-dirs", "candidates", "yardsticks")
INT_KEYS = ("timing-min", "timing-cases")
KNOWN_KEYS = ("kernels-dirs", "candidates", *INT_KEYS, "yardsticks")


class DiscoveryError(ValueError):
    """A configuration problem that makes the candidate set ambiguous or wrong: one line."""


def find_pyproject(start: Path | None = None) -> Path | None:
    """The pyproject.toml of `start` (default: the current directory) or its nearest parent."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _squash(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def pyproject_section(pyproject: Path) -> dict:
    """`[tool.fa-harness]` of a pyproject.toml, validated: every key known and of its
    type, and no table of a name close to it (a misspelt table would otherwise be read as
    "no configuration" and the team's kernels would vanish without a word)."""
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise DiscoveryError(f"{pyproject}: cannot read [tool.fa-harness]: {e}") from None
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        return {}
    for name in tool:
        if name != TABLE and (_squash(name) == _squash(TABLE) or
                              difflib.get_close_matches(name, [TABLE], n=1, cutoff=0.85)):
            raise DiscoveryError(f"{pyproject}: [tool.{name}] is not read; the table is "
                                 f"[tool.{TABLE}] (keys: {', '.join(KNOWN_KEYS)})")
    section = tool.get(TABLE, {})
    if not isinstance(section, dict):
        raise DiscoveryError(f"{pyproject}: [tool.{TABLE}] must be a table")
    for key, value in section.items():
        if key not in KNOWN_KEYS:
            close = difflib.get_close_matches(key, KNOWN_KEYS, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise DiscoveryError(f"{pyproject}: [tool.{TABLE}] has no key {key!r}{hint}; "
                                 f"known keys: {', '.join(KNOWN_KEYS)}")
        if key in LIST_KEYS and (not isinstance(value, list)
                                 or not all(isinstance(d, str) for d in value)):
            raise DiscoveryError(f"{pyproject}: [tool.{TABLE}] {key} must be a list of "
                                 f"strings")
        if key == "yardsticks" and not all(d.strip() for d in value):
            raise DiscoveryError(f"{pyproject}: [tool.{TABLE}] yardsticks must be a list of "
                                 f"candidate names or globs, none empty")
        if key in INT_KEYS and (isinstance(value, bool) or not isinstance(value, int)
                                or not 0 <= value <= 10_000):
            raise DiscoveryError(f"{pyproject}: [tool.{TABLE}] {key} must be an integer "
                                 f"from 0 to 10000")
    return section


def pyproject_list(pyproject: Path, key: str) -> list[str]:
    """`[tool.fa-harness] <key>` of a pyproject.toml: a list of strings (or nothing)."""
    return list(pyproject_section(pyproject).get(key, []))


def project_list(key: str) -> list[str]:
    """A list setting of `[tool.fa-harness]` (`yardsticks`, ...) of the nearest
    pyproject.toml, else empty."""
    if key not in LIST_KEYS:
        raise KeyError(key)
    pyproject = find_pyproject()
    return [] if pyproject is None else pyproject_list(pyproject, key)


def project_setting(key: str, default: int) -> int:
    """An integer setting of `[tool.fa-harness]` (`timing-min`, `timing-cases`) of the
    nearest pyproject.toml, else `default`."""
    if key not in INT_KEYS:
        raise KeyError(key)
    pyproject = find_pyproject()
    if pyproject is None:
        return default
    return int(pyproject_section(pyproject).get(key, default))


