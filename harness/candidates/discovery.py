"""Where candidates come from: the team's kernel folders and Python candidates.

Kernel folders are searched in this order, each variant keeping the origin it came from:

1. every `--kernels-dir DIR` given on the command line (pytest: `--fa-kernels-dir`);
2. `FA_HARNESS_KERNELS`, a `:`-separated list of folders;
3. `[tool.fa-harness] kernels-dirs = [...]` in the `pyproject.toml` of the current
   directory or the nearest parent that has one (paths relative to that file);
4. the variants shipped in the installed package (`harness/kernels/`).

A folder holds variant folders (`manifest.toml` + `.cu`) and single-file `.cu` variants
(manifest in a leading `/* fa-harness manifest ... */` comment). A name defined twice,
in one folder or in two, is one `DiscoveryError` naming both paths: which of the two the
team meant cannot be guessed. A folder that was named but does not exist is also an error.

Python candidates come from every `--candidate module:attr` (pytest: `--fa-candidate`),
`[tool.fa-harness] candidates = ["module:attr", ...]` in that pyproject.toml, and the
entry point group `fa_harness.candidates` (the shipped `flex_attention` and
`triton_fa2` are registered that way too).

What the command line configured (`configure`) is also exported in the environment
variable `FA_HARNESS_DISCOVERY`, so that every child process (isolated candidates, the
worker's scoring process) discovers exactly what its parent did.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the loaders import torch: only when variants are actually loaded
    from harness.candidates.variant_spec import LoadError, VariantSpec

ENV_KERNELS = "FA_HARNESS_KERNELS"
ENV_CONFIG = "FA_HARNESS_DISCOVERY"  # set by `configure`, read by child processes
ENTRY_POINT_GROUP = "fa_harness.candidates"
SHIPPED = "shipped"
# This module imports nothing heavy (the CLI and the pytest plugin import it to configure
# discovery), so it keeps its own copy of these names of harness.candidates.variant_spec.
KERNELS_ROOT = Path(__file__).resolve().parents[1] / "kernels"
MANIFEST_NAME = "manifest.toml"
NOT_VARIANTS = frozenset({"include"})


class DiscoveryError(ValueError):
    """A configuration problem that makes the candidate set ambiguous or wrong: one line."""


@dataclass(frozen=True)
class KernelDir:
    path: Path
    origin: str  # "--kernels-dir", "FA_HARNESS_KERNELS", "pyproject.toml (<path>)", "shipped"


@dataclass
class Config:
    kernels_dirs: list[str] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)  # "module:attr"


_config = Config()


def configure(kernels_dirs: Sequence[str] = (), candidates: Sequence[str] = ()) -> None:
    """Set the command line's folders and Python candidates, for this process and its
    children. Checks the folders at once, so a typo fails before any work is done."""
    global _config
    cfg = Config([str(Path(d).expanduser().resolve()) for d in kernels_dirs], list(candidates))
    for d, given in zip(cfg.kernels_dirs, kernels_dirs, strict=True):
        if not Path(d).is_dir():
            raise DiscoveryError(f"--kernels-dir {given}: no such folder")
    _config = cfg
    if cfg.kernels_dirs or cfg.candidates:
        os.environ[ENV_CONFIG] = json.dumps({"kernels_dirs": cfg.kernels_dirs,
                                             "candidates": cfg.candidates})
    else:
        os.environ.pop(ENV_CONFIG, None)


def current() -> Config:
    """The command line's configuration: this process's, else the one a parent exported."""
    if _config.kernels_dirs or _config.candidates:
        return _config
    raw = os.environ.get(ENV_CONFIG)
    if raw:
        try:
            data = json.loads(raw)
            return Config(list(data.get("kernels_dirs", [])), list(data.get("candidates", [])))
        except (ValueError, AttributeError, TypeError):
            raise DiscoveryError(f"{ENV_CONFIG} is not valid (set by fa-harness for its "
                                 f"child processes; unset it)") from None
    return _config


def find_pyproject(start: Path | None = None) -> Path | None:
    """The pyproject.toml of `start` (default: the current directory) or its nearest parent."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _pyproject_list(pyproject: Path, key: str) -> list[str]:
    """`[tool.fa-harness] <key>` of a pyproject.toml: a list of strings (or nothing)."""
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise DiscoveryError(f"{pyproject}: cannot read [tool.fa-harness]: {e}") from None
    section = data.get("tool", {}).get("fa-harness", {})
    if not isinstance(section, dict):
        raise DiscoveryError(f"{pyproject}: [tool.fa-harness] must be a table")
    items = section.get(key, [])
    if not isinstance(items, list) or not all(isinstance(d, str) for d in items):
        raise DiscoveryError(f"{pyproject}: [tool.fa-harness] {key} must be a list of "
                             f"strings")
    return items


def _pyproject_dirs(pyproject: Path) -> list[Path]:
    return [(pyproject.parent / d).resolve() for d in _pyproject_list(pyproject, "kernels-dirs")]


def kernel_dirs(cwd: Path | None = None) -> list[KernelDir]:
    """Every kernel folder in search order, each once. Raises DiscoveryError for a folder
    that was named (command line, environment, pyproject.toml) but does not exist."""
    found: list[KernelDir] = []

    def add(path: Path, origin: str, named_as: str) -> None:
        if not path.is_dir():
            raise DiscoveryError(f"{origin}: kernels folder {named_as} does not exist")
        if all(k.path != path for k in found):
            found.append(KernelDir(path, origin))

    for d in current().kernels_dirs:
        add(Path(d), "--kernels-dir", d)
    for d in filter(None, os.environ.get(ENV_KERNELS, "").split(":")):
        add(Path(d).expanduser().resolve(), ENV_KERNELS, d)
    pyproject = find_pyproject(cwd)
    if pyproject is not None:
        for d in _pyproject_dirs(pyproject):
            add(d, f"pyproject.toml ({pyproject})", str(d))
    if all(k.path != KERNELS_ROOT.resolve() for k in found):
        found.append(KernelDir(KERNELS_ROOT.resolve(), SHIPPED))
    return found


def _entries(kdir: KernelDir) -> list[Path]:
    """The variant folders and single-file .cu variants of one kernel folder."""
    out = []
    for p in sorted(kdir.path.iterdir()):
        if p.name in NOT_VARIANTS or p.name.startswith((".", "_")):
            continue
        # A folder with CUDA sources but no manifest is reported (a misnamed manifest must
        # not make a variant vanish); other folders (docs, scripts) are not variants.
        if p.is_dir() and ((p / MANIFEST_NAME).exists() or any(p.glob("*.cu"))) or p.is_file() and p.suffix == ".cu":
            out.append(p)
    return out


@dataclass
class Found:
    specs: list[tuple[VariantSpec, str]]  # (spec, origin)
    errors: list[LoadError]


def find_variants(cwd: Path | None = None) -> Found:
    """Every variant of every kernel folder. A variant that does not load is a LoadError
    (reported, never fatal); the same name twice is a DiscoveryError (fatal)."""
    from harness.candidates.variants import VariantError, load_variant

    specs: list[tuple[VariantSpec, str]] = []
    errors: list[LoadError] = []
    where: dict[str, Path] = {}
    for kdir in kernel_dirs(cwd):
        for entry in _entries(kdir):
            try:
                spec = load_variant(entry)
            except VariantError as e:
                errors.append(e.error)
                continue
            if spec.name in where:
                raise DiscoveryError(f"variant {spec.name!r} is defined twice: "
                                     f"{where[spec.name]} and {entry}")
            where[spec.name] = entry
            specs.append((spec, kdir.origin))
    return Found(specs, errors)


@dataclass
class FoundPython:
    candidates: list  # PythonCandidate
    errors: list[str]  # entry points that failed to load (reported, not fatal)


def _import_spec(spec: str, source: str = "--candidate", root: Path | None = None):
    """`module:attr` -> the object; DiscoveryError naming what is missing. The current
    directory (and the pyproject.toml's folder) are importable, as for `python -m`: a
    team's candidate module usually lives in its repository, not in an installed package."""
    import importlib
    import sys

    for folder in (str(Path.cwd()), str(root) if root else None):
        if folder and folder not in sys.path:
            sys.path.append(folder)
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise DiscoveryError(f"{source} {spec!r}: expected module:attribute")
    try:
        obj = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and (mod_name == e.name or mod_name.startswith(e.name + ".")):
            raise DiscoveryError(f"{source} {spec}: no module named {e.name!r}") from None
        raise DiscoveryError(f"{source} {spec}: importing {mod_name} failed: "
                             f"no module named {e.name!r}") from None
    except Exception as e:
        raise DiscoveryError(f"{source} {spec}: importing {mod_name} failed: "
                             f"{type(e).__name__}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise DiscoveryError(f"{source} {spec}: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def find_python() -> FoundPython:
    """Python candidates: entry points of `fa_harness.candidates`, then `--candidate`s.
    A broken entry point is reported; a broken `--candidate` is a DiscoveryError (the
    user named it on this command line)."""
    from importlib.metadata import entry_points

    from harness.candidates.python_candidate import kernels_of, to_candidate

    found: dict[str, tuple[object, str]] = {}
    errors: list[str] = []

    def add(kernels, origin: str) -> None:
        for k in kernels:
            if k.name in found:
                raise DiscoveryError(f"Python candidate {k.name!r} is defined twice: "
                                     f"{found[k.name][1]} and {origin}")
            found[k.name] = (to_candidate(k, origin), origin)

    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        origin = f"entry point {ep.name} ({ep.value})"
        try:
            kernels = kernels_of(ep.load(), origin)
        except Exception as e:  # one broken plugin package must not hide the others
            errors.append(f"{origin}: {type(e).__name__}: {e}")
            continue
        add(kernels, origin)
    named = [(spec, "--candidate") for spec in current().candidates]
    pyproject = find_pyproject()
    if pyproject is not None:
        named += [(spec, f"pyproject.toml ({pyproject})")
                  for spec in _pyproject_list(pyproject, "candidates")]
    for spec, source in named:
        obj = _import_spec(spec, source, pyproject.parent if pyproject else None)
        try:
            kernels = kernels_of(obj, f"{source} {spec}")
        except Exception as e:
            raise DiscoveryError(str(e) if isinstance(e, TypeError) else
                                 f"{source} {spec}: {type(e).__name__}: {e}") from None
        add(kernels, f"{source} {spec}")
    return FoundPython([found[n][0] for n in sorted(found)], errors)


def python_candidates() -> tuple[list, list[str]]:
    """(candidates, errors) for the registry."""
    found = find_python()
    return found.candidates, found.errors


def variant_path(name: str, cwd: Path | None = None) -> Path | None:
    """The folder (or single .cu file) of the discovered variant called `name`, else None.
    A Python candidate of that name is a DiscoveryError: submissions are CUDA source."""
    for spec, _ in find_variants(cwd).specs:
        if spec.name == name:
            man = spec.manifest_path
            return man.parent if man.name == MANIFEST_NAME else man
    if any(c.name == name for c in find_python().candidates):
        raise DiscoveryError(f"{name} is a Python candidate: submissions are CUDA source "
                             f"(a variant folder or an annotated .cu file)")
    return None
