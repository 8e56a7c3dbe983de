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

Nothing is ignored silently: a key of `[tool.fa-harness]` the harness does not know, or a
table whose name is close to it (`[tool.fa_harness]`, `[tool.fa-harnes]`), is a
DiscoveryError naming the known keys; so is a kernels folder that holds no variant. Every
source searched is recorded with what it contributed (`sources()`), so `fa-harness
kernels` and `ci` can say where each candidate came from and which source gave nothing.

Ownership (`owned_by_team`): the team's own candidates are those of its kernel folders,
`--candidate`s, pyproject candidates and entry points of other packages. What ships with
fa-harness (its variants, its entry points, the CPU models, the SDPA peers) is a
yardstick, except when fa-harness itself is the project being worked on (run from its
own source tree, not an installed copy): then its shipped candidates are that team's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.candidates.project import DiscoveryError, find_pyproject, pyproject_list

__all__ = ["DiscoveryError", "find_pyproject"]

if TYPE_CHECKING:  # the loaders import torch: only when variants are actually loaded
    from harness.candidates.variant_spec import LoadError, VariantSpec

ENV_KERNELS = "FA_HARNESS_KERNELS"
ENV_CONFIG = "FA_HARNESS_DISCOVERY"  # set by `configure`, read by child processes
ENTRY_POINT_GROUP = "fa_harness.candidates"
SHIPPED = "shipped"
DIST_NAME = "fa-harness"
# This module imports nothing heavy (the CLI and the pytest plugin import it to configure
# discovery), so it keeps its own copy of these names of harness.candidates.variant_spec.
KERNELS_ROOT = Path(__file__).resolve().parents[1] / "kernels"
MANIFEST_NAME = "manifest.toml"
NOT_VARIANTS = frozenset({"include"})


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


def _pyproject_dirs(pyproject: Path) -> list[Path]:
    return [(pyproject.parent / d).resolve() for d in pyproject_list(pyproject, "kernels-dirs")]


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


@dataclass
class Source:
    """One place candidates were searched: what it gave, and how many failed to load."""

    what: str  # "kernels folder /repo/kernels", "--candidate my.mod:attr", ...
    origin: str
    names: list[str] = field(default_factory=list)
    errors: int = 0

    def line(self) -> str:
        where = self.what if self.origin == self.what else f"{self.what} ({self.origin})"
        if self.names:
            gave = ", ".join(self.names)
        else:
            gave = "nothing" + (f" ({self.errors} failed to load)" if self.errors else "")
        return f"{where}: {gave}"


_sources: dict[str, list[Source]] = {"cuda": [], "python": []}


def sources() -> list[Source]:
    """Every source the last discovery searched (kernel folders, then Python candidates)."""
    return [*_sources["cuda"], *_sources["python"]]


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
    seen: list[Source] = []
    for kdir in kernel_dirs(cwd):
        entries = _entries(kdir)
        if not entries:
            raise DiscoveryError(f"{kdir.origin}: kernels folder {kdir.path} holds no "
                                 f"variant (a folder with {MANIFEST_NAME} and its .cu "
                                 f"sources, or a .cu file with a manifest comment; "
                                 f"`fa-harness kernels --json` shows the template's path)")
        src = Source(f"kernels folder {kdir.path}", kdir.origin)
        seen.append(src)
        for entry in entries:
            try:
                loaded = load_variant(entry).with_flavors()  # and its [[flavor]]s
            except VariantError as e:
                errors.append(e.error)
                src.errors += 1
                continue
            for spec in loaded:
                if spec.name in where:
                    raise DiscoveryError(f"variant {spec.name!r} is defined twice: "
                                         f"{where[spec.name]} and {entry}")
                where[spec.name] = entry
                specs.append((spec, kdir.origin))
                src.names.append(spec.name)
    _sources["cuda"] = seen
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
    seen: list[Source] = []

    def add(kernels, origin: str, shipped: bool = False) -> None:
        src = Source(origin, origin)
        seen.append(src)
        for k in kernels:
            if k.name in found:
                raise DiscoveryError(f"Python candidate {k.name!r} is defined twice: "
                                     f"{found[k.name][1]} and {origin}")
            cand = to_candidate(k, origin)
            cand.meta["shipped"] = shipped
            found[k.name] = (cand, origin)
            src.names.append(k.name)

    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        origin = f"entry point {ep.name} ({ep.value})"
        try:
            kernels = kernels_of(ep.load(), origin)
        except Exception as e:  # one broken plugin package must not hide the others
            errors.append(f"{origin}: {type(e).__name__}: {e}")
            seen.append(Source(origin, origin, errors=1))
            continue
        add(kernels, origin, shipped=_dist_name(ep) == DIST_NAME)
    named = [(spec, "--candidate") for spec in current().candidates]
    pyproject = find_pyproject()
    if pyproject is not None:
        named += [(spec, f"pyproject.toml ({pyproject})")
                  for spec in pyproject_list(pyproject, "candidates")]
    for spec, source in named:
        obj = _import_spec(spec, source, pyproject.parent if pyproject else None)
        try:
            kernels = kernels_of(obj, f"{source} {spec}")
        except Exception as e:
            raise DiscoveryError(str(e) if isinstance(e, TypeError) else
                                 f"{source} {spec}: {type(e).__name__}: {e}") from None
        add(kernels, f"{source} {spec}")
    _sources["python"] = seen
    return FoundPython([found[n][0] for n in sorted(found)], errors)


def _dist_name(ep: object) -> str | None:
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) if dist is not None else None
    return name.lower().replace("_", "-") if isinstance(name, str) else None


def harness_is_the_project(cwd: Path | None = None) -> bool:
    """True when fa-harness itself is the project at hand: imported from a source tree
    (not an installed copy under site-packages) and run from inside that tree. Its
    shipped candidates are then the team's own (timed as such by the gate)."""
    root = KERNELS_ROOT.resolve().parents[1]
    if any(part in ("site-packages", "dist-packages") for part in root.parts):
        return False
    here = (cwd or Path.cwd()).resolve()
    return here == root or root in here.parents


def shipped(meta: dict) -> bool:
    """A candidate that ships with fa-harness (shipped variant or entry point, or a
    built-in one without an origin: CPU models, SDPA peers)."""
    origin = meta.get("origin")
    return origin is None or origin == SHIPPED or bool(meta.get("shipped"))


def owned_by_team(meta: dict, cwd: Path | None = None) -> bool:
    """Whether a candidate (by its `meta`) is the team's own (module doc)."""
    return not shipped(meta) or harness_is_the_project(cwd)


def python_candidates() -> tuple[list, list[str]]:
    """(candidates, errors) for the registry."""
    found = find_python()
    return found.candidates, found.errors


def unregistered_note() -> str | None:
    """Why the shipped Python candidates are missing, when they are: fa-harness imported
    from a source tree that was never installed (no package metadata) has no entry
    points, and its own Python candidates are registered only by entry points."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution(DIST_NAME)
    except PackageNotFoundError:
        return (f"{DIST_NAME} is not installed (no package metadata), so its entry points, "
                f"its own Python candidates among them, are not discovered: run "
                f"`pip install -e .` in its source tree")
    return None


def variant_path(name: str, cwd: Path | None = None) -> Path | None:
    """The folder (or single .cu file) of the discovered variant called `name`, else None.
    A Python candidate of that name is a DiscoveryError: submissions are CUDA source."""
    for spec, _ in find_variants(cwd).specs:
        if spec.name == name:
            man = spec.manifest_path
            if man.name == MANIFEST_NAME and man.parent.name != name:
                raise DiscoveryError(f"{name} is a [[flavor]] of {man.parent.name}: a "
                                     f"submission is one variant (submit {man.parent.name})")
            return man.parent if man.name == MANIFEST_NAME else man
    if any(c.name == name for c in find_python().candidates):
        raise DiscoveryError(f"{name} is a Python candidate: submissions are CUDA source "
                             f"(a variant folder or an annotated .cu file)")
    return None
