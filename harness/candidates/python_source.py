"""The source hash of a Python-callable candidate: what its timing depends on that its name
does not say.

A CUDA variant's hash covers its source and compile options (harness.candidates.
variant_spec). A Python candidate has no single source file, so its hash covers:

- the files of the modules its callables are defined in (the forward, its `prepare`, the
  backward), and of the modules of the same top-level package those modules use by name
  (one level: `triton_fa2` uses `triton_common`), so an edit of the kernel's code or of a
  helper it calls re-keys it;
- the installed versions of the libraries that compile or run it (torch, triton): a
  flex_attention whose Inductor changed is not the same code.

The noise model (harness.records.noise) pairs runs at one source hash: with an empty hash
every Python candidate's history looked like one source whatever changed, and none could
say "the code did not change".
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

LIBRARIES = ("torch", "triton")


def _module_of(fn: Any) -> ModuleType | None:
    fn = getattr(fn, "func", fn)  # a functools.partial
    name = getattr(fn, "__module__", None)
    return sys.modules.get(name) if isinstance(name, str) else inspect.getmodule(fn)


def _file(mod: ModuleType | None) -> str | None:
    path = getattr(mod, "__file__", None)
    return path if isinstance(path, str) and path.endswith(".py") else None


def _used_modules(mod: ModuleType) -> Iterable[ModuleType]:
    """The modules of `mod`'s own top-level package that it names: imported modules, and
    the modules of the functions and classes it imported."""
    top = mod.__name__.split(".")[0]
    for value in list(vars(mod).values()):
        other = value if isinstance(value, ModuleType) else (
            _module_of(value) if inspect.isfunction(value) or inspect.isclass(value) else None)
        if other is not None and other is not mod and other.__name__.split(".")[0] == top:
            yield other


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def source_hash(callables: Iterable[Callable[..., Any] | None],
                extra: str = "") -> str:
    """16 hex digits over the callables' module files, the modules they use and the
    library versions (module doc); `extra` adds what else defines the candidate."""
    files: set[str] = set()
    for fn in callables:
        mod = _module_of(fn) if fn is not None else None
        if mod is None:
            continue
        for m in (mod, *_used_modules(mod)):
            if (path := _file(m)) is not None:
                files.add(path)
    h = hashlib.sha256(extra.encode())
    for path in sorted(files):
        h.update(b"\0" + Path(path).name.encode() + b"\0")
        try:
            h.update(Path(path).read_bytes())
        except OSError:  # a module loaded from a zip or removed since: its name stands in
            h.update(path.encode())
    for dist in LIBRARIES:
        h.update(f"\0{dist}={_version(dist)}".encode())
    return h.hexdigest()[:16]
