"""One key for a CI job's compile-cache directory (harness.paths.cache_dir): it changes
when a candidate's source or the toolchain does, so the job saves a fresh cache then, and
keeps restoring the old one otherwise (`fa-harness kernels --cache-key`).

Restoring an older cache under a new key is safe: every tool keys its own entries
(harness.paths), so a stale entry is only never hit. The key covers the versions of
fa-harness, Python, torch (and its CUDA), Triton, CuPy, nvcc, the GPU model and compute
capability when one is visible, and every candidate's source (a variant's source hash, a
Python candidate's module file).
"""

from __future__ import annotations

import hashlib
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def toolchain() -> list[str]:
    """The versions the compiled artifacts depend on."""
    from harness.candidates.nvcc import nvcc_version

    parts = [f"python {platform.python_version()}", f"fa-harness {_version('fa-harness')}",
             f"triton {_version('triton')}", f"nvcc {nvcc_version()}"]
    for dist in ("cupy-cuda13x", "cupy-cuda12x", "cupy"):
        if _version(dist) != "-":
            parts.append(f"{dist} {_version(dist)}")
    torch = sys.modules.get("torch")
    if torch is None:
        import torch
    parts.append(f"torch {torch.__version__} cuda {torch.version.cuda}")
    try:
        if torch.cuda.is_available():
            cc = torch.cuda.get_device_capability()
            parts.append(f"gpu {torch.cuda.get_device_name()} sm_{cc[0]}{cc[1]}")
    except Exception:  # noqa: BLE001 - a broken driver: the key simply has no GPU part
        parts.append("gpu -")
    return parts


def _source_of(cand: Any) -> str:
    spec = getattr(cand, "spec", None)
    if spec is not None:
        return spec.source_hash
    kernel = getattr(cand, "kernel", None)
    fn = getattr(kernel, "fn", None)
    mod = sys.modules.get(getattr(fn, "__module__", "") or "")
    path = getattr(mod, "__file__", None)
    if path and Path(path).is_file():
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return "-"


def cache_key(candidates: Sequence[Any]) -> str:
    h = hashlib.sha256()
    for part in toolchain():
        h.update(part.encode() + b"\0")
    for cand in sorted(candidates, key=lambda c: c.name):
        if getattr(cand, "kind", "") in ("cuda", "python"):
            h.update(f"{cand.name}={_source_of(cand)}".encode() + b"\0")
    return "fa-harness-" + h.hexdigest()[:24]
