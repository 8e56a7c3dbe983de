"""Dashboard fixtures built from the project's real committed H200 records (results/).

Each database is filled the way the operator fills one: `fa-harness import --trusted` of
record files (the project's own history; untrusted imports are never baselines).
The variations are derived from the real records, so every field the dashboard reads
has the shape real runs give it (calibration keys, GPU model keys, grids, parents):
  - "sample": `fa-harness import --trusted` of `SAMPLE`, committed records of every kind of
    run on both GPUs in their own order (gate runs, an A/A chain, perf, decode with paged
    and varlen caches, backward), and the verdicts import computes between them: what the
    whole of results/ would show these tests, at a third of its import;
  - "history": the first two committed records (the perf and decode runs of 2026-11-29,
    whose run ids 1 and 2 the tests name) plus a child commit whose perf run is slower for one kernel and
    fails one case (import computes the regression verdicts), a decode run with only fp16
    cases, a run without calibration, a re-run of the first commit made later, and a
    run on another GPU model; the child commit's records name their repository;
  - "dense": a sample of the committed records that hold no serving case (varlen, paged,
    sliding window; `DENSE_SAMPLE`): the database of a team that runs dense cases only;
  - "one_grid": only the perf record;
  - "submissions": a migrated database with submissions and no run.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
PERF = RESULTS / "h200-20261129T201729Z-perf.json"
DECODE = RESULTS / "h200-20261129T201729Z-decode.json"
# The decode grid with its paged and varlen forms (splitkv, SDPA cuDNN and flash).
SERVING_DECODE = RESULTS / "h200-20261202T055131Z-decode.json"
CHILD = "5a1c0ffee0ddba11deadbeef0123456789abcdef"
REPO_URL = "https://github.com/example/fa-harness"
SLOWED = "fa2_simt"  # the kernel the child commit makes slower
BROKEN_CASE_KERNEL = "fa2_mma"  # and the kernel that fails one case there


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _when(rec: dict[str, Any], hours: float) -> str:
    t = datetime.fromisoformat(rec["created_at"].replace("Z", "+00:00")).astimezone(UTC)
    return (t + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def derive(rec: dict[str, Any], *, hours: float, commit: str | None = None,
           parent: str | None = None) -> dict[str, Any]:
    out = copy.deepcopy(rec)
    out["uuid"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{rec['uuid']}/{hours}/{commit}"))
    out["created_at"] = _when(rec, hours)
    if commit is not None:
        out["commit"], out["parent"] = commit, parent
    return out


def slower(rec: dict[str, Any], kernel: str, factor: float) -> None:
    for e in rec["results"]:
        if e["kernel"] != kernel or e.get("median_ms") is None:
            continue
        for key in ("median_ms", "min_ms", "iqr_ms"):
            if e.get(key) is not None:
                e[key] *= factor
        e["samples_ms"] = [s * factor for s in e.get("samples_ms") or []]
        if e.get("tflops"):
            e["tflops"] /= factor


def fail_one(rec: dict[str, Any], kernel: str) -> str:
    e = next(e for e in rec["results"] if e["kernel"] == kernel)
    e["status"] = "failed"
    errs = e["errors"]
    errs["out_err"] = errs["base_err"] * 9.0
    errs["ratio"] = 9.0
    e["message"] = (f"max error {errs['out_err']:.3e} > 2 x {errs['base_err']:.3e} + "
                    f"{errs['floor']:.3e} (ratio 9.00)")
    return e["case_id"]


def history_records() -> list[dict[str, Any]]:
    perf, decode = load(PERF), load(DECODE)
    first = perf["commit"]
    child_perf = derive(perf, hours=24, commit=CHILD, parent=first)
    slower(child_perf, SLOWED, 1.3)
    fail_one(child_perf, BROKEN_CASE_KERNEL)
    child_decode = derive(decode, hours=24.1, commit=CHILD, parent=first)
    # Every result of the newest decode run has one dtype (what pandas tripped over).
    child_decode["results"] = [e for e in child_decode["results"]
                               if e["case"]["dtype"] == "float16"]
    for r in (child_perf, child_decode):
        r["env"] = dict(r.get("env") or {}, repository_url=REPO_URL)
    # A re-run of the first commit made after the child: commit order puts it first.
    rerun = derive(decode, hours=30)
    uncalibrated = derive(perf, hours=31, commit=CHILD, parent=first)
    uncalibrated["calibration"] = None
    uncalibrated["branch"] = "no-calibration"
    other_gpu = derive(perf, hours=2)
    other_gpu["gpu"] = dict(other_gpu["gpu"], name="NVIDIA H100 80GB HBM3",
                            model_key="nvidia-h100-80gb-hbm3", uuid="GPU-other")
    slower(other_gpu, "sdpa_flash", 1.7)
    return [child_perf, child_decode, rerun, uncalibrated, other_gpu]


def write(records: list[dict[str, Any]], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(records):
        (directory / f"derived-{i:02d}.json").write_text(json.dumps(r))
    return directory


def fa_import(url: str, *paths: Path) -> str:
    from harness.cli import main

    rc = main(["import", "--trusted", *map(str, paths), "--db", url])
    assert rc == 0, f"fa-harness import exited {rc}"
    return url


# The "sample" database: each record is here for what a test reads in it.
SAMPLE = [
    PERF, DECODE,  # the first runs of the H200's history
    # Five gate runs at five commits: template's 1k-key decode case at levels 2.7% apart
    # and fa1's wobble on the same shape (test_noise, test_gate_reach); the last one is
    # the run test_gate_reach plants a child of.
    *(RESULTS / f"h200-2026120{n}-ci{k}.json" for n, k in (
        ("1T130808Z", ""), ("1T195440Z", "-cold"), ("1T195739Z", "-warm"),
        ("2T022403Z", "-cold"))),
    # An A/A chain of one commit: runs judged against pooled windows (test_base_runs).
    *sorted(RESULTS.glob("h200-20261202T0[12]*-ci-aa[1-5].json")),
    RESULTS / "h200-20261202T075402Z-ci-cold.json",
    SERVING_DECODE,  # paged and varlen caches (test_dashboard_serving)
    # Backward runs (forward and backward series apart: test_pass_records); two commits
    # of backward runs one per dtype, the newest judged against a pooled window holding
    # the other dtype's run (test_dashboard_real); then a perf run: the last runs time no
    # decode case (the history of a case they skip: test_noise).
    RESULTS / "h200-20261201T221903Z-perf-bwd.json",
    *(RESULTS / f"h200-20261204T{t}Z-perf-bwd.json" for t in ("073954", "074418",
                                                              "150417", "150829")),
    RESULTS / "h200-20261206T142550Z-perf.json",
    # The other GPU's perf run and two gate runs (what Compare opens on there).
    RESULTS / "h100-20261205T072458Z-perf.json",
    *sorted(RESULTS.glob("h100-20261206T02[34]*-ci-aa[12].json")),
]

# Dense records of both GPUs and of each kind of run (perf, decode, backward, gate A/A):
# enough for the dense-only pages, a fifth of the time of importing every dense record.
DENSE_SAMPLE = [PERF, DECODE, RESULTS / "h200-20261201T221903Z-perf-bwd.json",
                RESULTS / "h200-20261202T020708Z-ci-aa1.json",
                RESULTS / "h100-20261205T072458Z-perf.json"]


def dense_record_files(paths: list[Path] | None = None) -> list[Path]:
    """The committed record files (of `paths`, else all) none of whose results is a
    serving case."""
    from harness.core.cases import Case

    def serving(path: Path) -> bool:
        rec = load(path)
        return any(Case.from_dict(e["case"]).is_serving or Case.from_dict(e["case"]).has_window
                   for e in rec.get("results", []))

    return [p for p in (paths or sorted(RESULTS.glob("*.json"))) if not serving(p)]


def build(kind: str, directory: Path) -> str:
    """A SQLite database of `kind` (see the module docstring) under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{directory / f'{kind}.sqlite'}"
    if kind == "sample":
        return fa_import(url, *SAMPLE)
    if kind == "history":
        fa_import(url, DECODE, PERF)
        return fa_import(url, write(history_records(), directory / "derived"))
    if kind == "one_grid":
        return fa_import(url, PERF)
    if kind == "dense":
        dense = dense_record_files(DENSE_SAMPLE)
        assert dense == DENSE_SAMPLE, "a record of the dense sample holds a serving case"
        return fa_import(url, *dense)
    if kind == "submissions":
        return with_submissions(url)
    raise ValueError(kind)


def session_dir(factory: Any) -> Path:
    """The folder every pytest-xdist worker of this session sees (the workers' own temp
    folders lie in it), or the session's temp folder without xdist."""
    import os

    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared(kind: str, factory: Any, make: Callable[[Path], str] | None = None) -> str:
    """The database `build(kind)` (or `make(directory)`) makes, built once per test session
    and shared by the pytest-xdist workers (the first to ask builds it under a file lock;
    the others wait for it and reuse it): importing the committed records is the slowest
    step of many tests, and the same records give the same database. The file is for
    reading: a test that imports more into it takes `copy_db(...)` of it."""
    from filelock import FileLock

    root = session_dir(factory) / "realdata-shared"
    root.mkdir(parents=True, exist_ok=True)
    done = root / f"{kind}.url"
    with FileLock(str(root / f"{kind}.lock")):
        if not done.exists():
            url = (make or (lambda d: build(kind, d)))(root / kind)
            done.write_text(url)
    return done.read_text()


def copy_db(url: str, directory: Path) -> str:
    """A private copy of the SQLite database at `url` under `directory`, to import into."""
    import sqlite3

    directory.mkdir(parents=True, exist_ok=True)
    dst = directory / Path(url.removeprefix("sqlite:///")).name
    # SQLite's backup: a consistent copy whatever its write-ahead log holds.
    src, out = sqlite3.connect(url.removeprefix("sqlite:///")), sqlite3.connect(dst)
    try:
        src.backup(out)
    finally:
        src.close()
        out.close()
    return f"sqlite:///{dst}"


def with_submissions(url: str) -> str:
    from harness.records.db import open_db
    from harness.records.db.models import Submission

    db = open_db(url)
    t0 = datetime(2026, 11, 30, tzinfo=UTC)
    long_message = ("output differs from the reference on case b4h16-1024x1024-d128-bf16-causal:"
                    " max error 3.1e-02 > 2 x 2.4e-03 + 1.1e-03 (ratio 12.8); the first wrong "
                    "element is in the last key block, where the causal mask is partial")
    blank = {"score": None, "message": None, "failing_cases": None, "detail": None}
    try:
        with db.engine.begin() as conn:
            conn.execute(Submission.__table__.insert(), [{**blank, **row} for row in [
                {"name": "full_grid", "submitter": "ana", "source": "{}", "source_hash": "a",
                 "status": "done", "verdict": "scored", "score": 2.1, "created_at": t0,
                 "finished_at": t0 + timedelta(minutes=5),
                 "detail": {"coverage": {"timed": 48, "of": 48}}},
                {"name": "easy_cases_only", "submitter": "cy", "source": "{}",
                 "source_hash": "b", "status": "done", "verdict": "scored", "score": 9.0,
                 "created_at": t0, "finished_at": t0 + timedelta(minutes=7),
                 "detail": {"coverage": {"timed": 2, "of": 48}}},
                {"name": "wrong_mask", "submitter": "eve", "source": "{}", "source_hash": "c",
                 "status": "done", "verdict": "incorrect", "created_at": t0,
                 "finished_at": t0 + timedelta(minutes=2), "message": long_message,
                 "failing_cases": ["b4h16-1024x1024-d128-bf16-causal"]},
            ]])
    finally:
        db.close()
    return url


def dashboard_app(url: str, monkeypatch: Any, **params: str) -> Any:
    """The dashboard run once through Streamlit's AppTest on database `url`, with the
    query parameters `params`; no page may raise."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("FA_HARNESS_DB", url)
    at = AppTest.from_file(str(ROOT / "harness" / "dashboard" / "app.py"), default_timeout=90)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def sql(url: str, query: str, **params: Any) -> list:
    """The rows of one SQL query against the database at `url`."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(query), params))
    finally:
        engine.dispose()
