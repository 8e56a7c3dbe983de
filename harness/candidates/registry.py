"""Every candidate the project knows: CPU algorithm models, CUDA kernel variants,
PyTorch SDPA peers and Python candidates, discovered from their modules.

Sources:
  model    harness.candidates.models.all_models()
  cuda     harness.candidates.cuda_candidate.discovered_variants(): the variants of every
           kernel folder (harness.candidates.discovery: --kernels-dir, FA_HARNESS_KERNELS,
           pyproject.toml, then the shipped ones); variants that fail to load are kept as
           `LoadError`s (reported by `load_errors()` and `fa-harness kernels`), never a crash
  peer     harness.candidates.peers.sdpa_peers()
  python   harness.candidates.discovery.python_candidates(): entry points of the group
           `fa_harness.candidates` and every --candidate module:attr
  planted  harness.candidates.models.named_planted_bugs(): deliberately wrong models that prove
           the checks catch each bug class; never part of a default discovery

A source whose module (or entry-point function) does not exist is skipped with a logged
reason (`notes()`); any other import problem (a SyntaxError, a missing dependency inside the module) is raised, so
a broken module can never hide as "no candidates".
"""

from __future__ import annotations

import fnmatch
import importlib
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from harness.candidates.discovery import DiscoveryError
from harness.core.candidate import Candidate

log = logging.getLogger(__name__)

DEFAULT_KINDS = ("model", "cuda", "peer", "python")
SOURCES = {
    "model": ("harness.candidates.models", "all_models"),
    "cuda": ("harness.candidates.cuda_candidate", "discovered_variants"),
    "peer": ("harness.candidates.peers", "sdpa_peers"),
    "python": ("harness.candidates.discovery", "python_candidates"),
    "planted": ("harness.candidates.models", "named_planted_bugs"),
}

_cache: dict[tuple[str, ...], list[Candidate]] = {}
_where_cached: tuple[str, ...] | None = None
_load_errors: list[Any] = []
_notes: list[str] = []


def _import_source(module: str) -> Any | None:
    """The module, or None when it does not exist (only that exact module missing)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            note = f"{module} is not present: its candidates are not discovered"
            if note not in _notes:
                _notes.append(note)
                log.info(note)
            return None
        raise


def _from_source(kind: str) -> list[Candidate]:
    module_name, func_name = SOURCES[kind]
    module = _import_source(module_name)
    if module is None:
        return []
    func = getattr(module, func_name, None)
    if func is None:  # the module exists but does not provide its entry point (yet)
        note = f"{module_name} has no {func_name}(): its candidates are not discovered"
        if note not in _notes:
            _notes.append(note)
            log.info(note)
        return []
    if kind == "python":
        from harness.candidates.discovery import unregistered_note

        note = unregistered_note()
        if note is not None and note not in _notes:
            _notes.append(note)
            log.info(note)
    if kind in ("cuda", "python"):
        found, errors = func()
        for err in errors:
            if err not in _load_errors:
                _load_errors.append(err)
        return list(found)
    return list(func())


def kernels_root() -> Path:
    """The shipped kernels/ folder of the installed package (one sub-folder per variant);
    `harness.candidates.discovery.kernel_dirs()` lists every folder searched."""
    return Path(__file__).resolve().parents[1] / "kernels"


def _where() -> tuple[str, ...]:
    """What discovery searches besides the package: the command line's folders and Python
    candidates (`discovery.configure`), FA_HARNESS_KERNELS and the working directory (its
    pyproject.toml)."""
    from harness.candidates import discovery

    cfg = discovery.current()
    return (*cfg.kernels_dirs, "|", *cfg.candidates, "|",
            os.environ.get(discovery.ENV_KERNELS, ""), os.getcwd())


def discover(kinds: Iterable[str] = DEFAULT_KINDS) -> list[Candidate]:
    """Candidates of the given kinds, sorted by name (a stable order for pytest-xdist).
    Cached per process for one set of places searched (`_where`): a later command in the
    same process with another --kernels-dir (the pytest plugin, a test) discovers again,
    its load errors and notes its own. `clear_cache()` forgets."""
    global _where_cached
    kinds = tuple(kinds)
    unknown = [k for k in kinds if k not in SOURCES]
    if unknown:
        raise ValueError(f"unknown candidate kind(s) {unknown}; known: {', '.join(SOURCES)}")
    where = _where()
    if where != _where_cached:
        clear_cache()
        _where_cached = where
    if kinds not in _cache:
        found: dict[str, Candidate] = {}
        for kind in kinds:
            for cand in _from_source(kind):
                if cand.name in found:
                    raise DiscoveryError(
                        f"two candidates are named {cand.name!r}: "
                        f"{origin(found[cand.name])} and {origin(cand)}")
                found[cand.name] = cand
        _cache[kinds] = [found[n] for n in sorted(found)]
    return list(_cache[kinds])


def origin(candidate: Candidate) -> str:
    """Where a candidate comes from: its kernel folder's origin and path, its entry point
    or --candidate, or the harness itself (models, peers)."""
    where = candidate.meta.get("origin")
    if where is None:
        return "built in"
    path = candidate.meta.get("manifest_path")
    return f"{where}: {path}" if path else str(where)


def owned(candidate: Candidate, named: Sequence[str] = (),
          yardsticks: Sequence[str] | None = None) -> bool:
    """Whether the gate treats `candidate` as the team's own (timed with a guaranteed
    minimum, never excused for dropping out) rather than as a yardstick. A declared
    yardstick (`yardsticks`: names or globs; None: `[tool.fa-harness] yardsticks` of the
    nearest pyproject.toml) never is, whatever else says so; otherwise named on the
    command line (`named`: names or globs), or its source is the team's (discovery's
    `owned_by_team`). The SDPA peers and Python candidates declared `yardstick=True`
    (the installed libraries' peers) are yardsticks unless named."""
    from harness.candidates.discovery import owned_by_team

    if declared_yardstick(candidate.name, yardsticks):
        return False
    if any(fnmatch.fnmatchcase(candidate.name, pat) for pat in named):
        return True
    if candidate.kind in ("peer", "planted") or (candidate.meta or {}).get("yardstick"):
        return False
    return owned_by_team(candidate.meta or {})


def declared_yardstick(name: str, yardsticks: Sequence[str] | None = None) -> bool:
    """Whether the team declared candidate `name` a yardstick (`yardsticks`: names or
    globs; None: `[tool.fa-harness] yardsticks` of the nearest pyproject.toml)."""
    if yardsticks is None:
        from harness.candidates.project import project_list

        yardsticks = project_list("yardsticks")
    return any(fnmatch.fnmatchcase(name, pat) for pat in yardsticks)


def load_errors() -> list[Any]:
    """Variants that could not be loaded (harness.candidates.variants.LoadError), after `discover`."""
    return list(_load_errors)


def notes() -> list[str]:
    """Why some source contributed nothing (its module is not present)."""
    return list(_notes)


def clear_cache() -> None:
    _cache.clear()
    _load_errors.clear()
    _notes.clear()


def get_candidate(name: str) -> Candidate:
    """The candidate called `name`, among every kind including planted bugs."""
    for cand in discover(DEFAULT_KINDS) + discover(("planted",)):
        if cand.name == name:
            return cand
    raise KeyError(f"no candidate named {name!r}; known: "
                   f"{', '.join(c.name for c in discover(DEFAULT_KINDS))}")


def candidate_from_dir(folder: str | Path) -> Candidate:
    """A CUDA variant built from one folder (manifest.toml + .cu): submissions."""
    from harness.candidates.cuda_candidate import CudaVariant
    from harness.candidates.variants import load_variant_dir

    return CudaVariant.from_spec(load_variant_dir(folder))


def unavailable_reason(candidate: Candidate) -> str | None:
    """None when this machine can run `candidate`: CPU always, CUDA only with a GPU; a
    candidate with its own `unavailable_reason()` (Python candidates) is asked first."""
    own = getattr(candidate, "unavailable_reason", None)
    if callable(own):
        return own()
    if candidate.device == "cpu":
        return None
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU (none available here)"
    return None


def available(candidate: Candidate) -> bool:
    return unavailable_reason(candidate) is None


def select(candidates: Sequence[Candidate], patterns: str | Sequence[str] | None
           ) -> list[Candidate]:
    """Candidates whose name matches any of `patterns` (names or shell globs, or one
    comma-separated string). None or empty selects all. ValueError when a pattern
    matches nothing (a typo must not silently run zero candidates)."""
    if not patterns:
        return list(candidates)
    if isinstance(patterns, str):
        patterns = [p.strip() for p in patterns.split(",") if p.strip()]
    chosen: list[Candidate] = []
    for pat in patterns:
        hits = [c for c in candidates if fnmatch.fnmatchcase(c.name, pat)]
        if not hits:
            raise ValueError(f"no candidate matches {pat!r}; known: "
                             f"{', '.join(c.name for c in candidates) or '(none)'}")
        chosen += [c for c in hits if c.name not in {x.name for x in chosen}]
    return sorted(chosen, key=lambda c: c.name)
