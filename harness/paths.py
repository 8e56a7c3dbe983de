"""Where fa-harness keeps its files on a runner: its home (the default database, the
spool) and its compile caches.

The compile caches are one folder, `cache_dir()` ($FA_HARNESS_CACHE, else
$FA_HARNESS_HOME/cache), so that a CI job can keep a single directory between jobs
(ci/user-repo/*.yml). Each tool keeps its own cache there and keys it itself:

  cupy/      CuPy's NVRTC cache (CUPY_CACHE_DIR): source, options, NVRTC version, arch
  triton/    Triton's kernel cache (TRITON_CACHE_DIR): source, constexprs, backend, arch
  inductor/  TorchInductor's FX-graph and autotune caches (TORCHINDUCTOR_CACHE_DIR):
             graph, shapes, torch version, device
  cubin/     nvcc cubins of fa-harness's own builds (the sandboxed builds of submissions
             and `kernels --compile`): source hash, options, nvcc version, arch

`use_compile_caches()` points the tools there unless the user already chose a folder for
one of them (an environment variable that is set wins). It runs before torch, Triton or
CuPy is imported (the CLI and the pytest plugin call it first), and every child process
inherits the variables.

No heavy import here: the CLI, the pytest plugin and the record format all need it.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

# Environment variable -> sub-folder of cache_dir().
CACHE_VARIABLES = {
    "CUPY_CACHE_DIR": "cupy",
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "FA_HARNESS_CUBIN_CACHE": "cubin",
}


def home_dir() -> Path:
    """FA_HARNESS_HOME, else the XDG data directory of the project."""
    env = os.environ.get("FA_HARNESS_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "fa-harness"


def cache_dir() -> Path:
    """The compile caches' folder: FA_HARNESS_CACHE, else <home>/cache."""
    env = os.environ.get("FA_HARNESS_CACHE")
    return Path(env).expanduser() if env else home_dir() / "cache"


def use_compile_caches(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Point every compiler's cache into `cache_dir()` where the user has not chosen one;
    returns {variable: folder} as it is now set (chosen or defaulted)."""
    env = os.environ if environ is None else environ
    root = cache_dir()
    out = {}
    for var, sub in CACHE_VARIABLES.items():
        if not env.get(var):
            env[var] = str(root / sub)
        out[var] = env[var]
    return out
