"""The regression walk: a committed H200 gate record and four commits after it with planted
steps, imported as the project's own records are (`realdata.fa_import`: `fa-harness
import --trusted`), so the alerts come from the same code the gate runs.

- C[0]: flex_attention 10% slower, C[1] back: one run's noise, withdrawn.
- C[1] on: fa2_mma 5% slower: one alert from C[1] (last good C[0]), not one per commit.
- C[2] on: sdpa_flash 8% slower: a yardstick's alert (a peer), never the team's.
- The same fa2_mma step at C[1] on an H100 (two runs, its fa2_mma and sdpa_flash cases
  only): the dashboard's triage shows one row for both GPU models.

Building it costs a minute on a loaded 2-core machine (every record is validated against
the JSON Schema twice), so the prepared SQLite file is cached under pytest's cache folder,
keyed by the records, the plan above and the source of everything that writes it
(`harness/records`, `harness/cli/cmd_import.py`); a test copies it and works on the copy.
`pytest --cache-clear` builds it afresh; with the cache plugin off (`-p no:cacheprovider`)
it is built once per test session, in a folder the pytest-xdist workers share.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import realdata

BASE = realdata.RESULTS / "h200-20261201T195739Z-ci-warm.json"
C = [f"{i:x}" * 40 for i in (10, 11, 12, 13)]  # four commits after the base record
H100 = {"name": "NVIDIA H100 80GB HBM3", "model_key": "nvidia-h100-80gb-hbm3",
        "uuid": "GPU-walk-h100"}
PLAN = "flex C0 x1.10; fa2_mma C1.. x1.05; sdpa_flash C2.. x1.08; h100 fa2_mma C1 x1.05; v1"


def records() -> list[dict[str, Any]]:
    base = realdata.load(BASE)
    out, parent = [], base["commit"]
    for i, commit in enumerate(C):
        rec = realdata.derive(base, hours=1 + i, commit=commit, parent=parent)
        if i == 0:
            realdata.slower(rec, "flex_attention", 1.10)
        if i >= 1:
            realdata.slower(rec, "fa2_mma", 1.05)
        if i >= 2:
            realdata.slower(rec, "sdpa_flash", 1.08)
        rec["env"] = dict(rec.get("env") or {}, repository_url=realdata.REPO_URL)
        out.append(rec)
        parent = commit
    for i, commit in enumerate(C[:2]):
        rec = realdata.derive(base, hours=1.5 + i, commit=commit,
                              parent=base["commit"] if i == 0 else C[0])
        rec["gpu"] = dict(rec["gpu"], **H100)
        rec["results"] = [e for e in rec["results"]
                          if e["kernel"] in ("fa2_mma", "sdpa_flash")]
        rec["kernels"] = {k: v for k, v in rec["kernels"].items()
                          if k in ("fa2_mma", "sdpa_flash")}
        if i == 1:
            realdata.slower(rec, "fa2_mma", 1.05)
        rec["env"] = dict(rec.get("env") or {}, repository_url=realdata.REPO_URL)
        out.append(rec)
    return out


def _key() -> str:
    h = hashlib.sha256(PLAN.encode())
    h.update(BASE.read_bytes())
    src = [*sorted((realdata.ROOT / "harness" / "records").rglob("*.py")),
           realdata.ROOT / "harness" / "cli" / "cmd_import.py",
           Path(__file__), Path(realdata.__file__)]
    for p in src:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def build(directory: Path, cache: Path | None = None) -> str:
    """A SQLite URL of a fresh copy of the walk database under `directory`, built once
    per key in `cache` (pytest's cache folder) when one is given."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "walk.sqlite"
    if cache is None:
        return _build(directory, None, target)
    from filelock import FileLock

    cache.mkdir(parents=True, exist_ok=True)
    # One builder at a time: a parallel worker waits for the file instead of building it too.
    with FileLock(str(cache / "walk.lock")):
        return _build(directory, cache, target)


def _build(directory: Path, cache: Path | None, target: Path) -> str:
    cached = cache / f"walk-{_key()}.sqlite" if cache is not None else None
    if cached is None or not cached.exists():
        work = directory / "build"
        shutil.rmtree(work, ignore_errors=True)
        url = f"sqlite:///{work / 'walk.sqlite'}"
        realdata.write([], work)
        realdata.fa_import(url, BASE)
        realdata.fa_import(url, realdata.write(records(), work / "planted"))
        if cached is None:
            shutil.move(work / "walk.sqlite", target)
            return f"sqlite:///{target}"
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(work / "walk.sqlite", tmp)
        os.replace(tmp, cached)  # atomic: a parallel worker sees all of it or nothing
        for old in cache.glob("walk-*.sqlite"):
            if old != cached:
                old.unlink(missing_ok=True)  # built by an older harness: never read again
    shutil.copyfile(cached, target)
    return f"sqlite:///{target}"


def cache_dir(config: Any, factory: Any = None) -> Path | None:
    """pytest's cache folder for the walk; where the cache plugin is off
    (`-p no:cacheprovider`, as `make test` runs), a folder of this session that its
    pytest-xdist workers share (`factory`: the tmp_path_factory), so the walk is built
    once per session rather than once per module and worker; None without either."""
    cache = getattr(config, "cache", None)
    if cache is not None:
        return cache.mkdir("fa-harness-walk")
    return None if factory is None else realdata.session_dir(factory) / "fa-harness-walk"
