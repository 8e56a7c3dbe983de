"""Serving-kind runs (varlen, paged, sliding-window cases) on top of the project's committed
H200 records, for the dashboard tests. The committed records hold the decode grid's paged
and varlen forms (the decode runs of 2026-12-02, realdata.SERVING_DECODE the first); for
volume and for serving-grid verdicts these are made the way the harness makes a record,
with generated timings:

  - each result is a `CaseResult` of a case of `harness.core.grids.get_grid("decode")` or
    `get_grid("serving")`, with the harness's own FLOP count (`flops.attention_flops`) and
    IO model bytes (`iomodel.hbm_bytes` for the variant's algorithm and tiles), skipped
    with `Support.reason_unsupported`'s reason where the variant does not declare the
    layout or window, annotated by the perf run's `annotate`, and written into a
    `RunRecord` through `RunRecord.from_results` (validated, `env.synthetic = true`);
  - the decode run (`DECODE_RUN`) is a later decode run of the committed decode record's
    GPU and calibration: its dense cases are the committed record's own results, its
    paged and varlen cases are timed relative to them (the dense case of the same shape,
    scaled by the bytes the case reads and a per-variant layout cost);
  - two serving-grid runs (`SERVING_A`, then `SERVING_B` on the next commit, where
    flex_attention's paged cases are 1.4x slower, triton_fa2 gained the sliding window
    and fails one varlen case), so import computes verdicts between them.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
import zlib
from datetime import datetime
from pathlib import Path
from typing import Any

import realdata

COMMIT_A = "5e1f0a11" * 5
COMMIT_B = "5e1f0b22" * 5
# The newest committed record (its name begins with its UTC time): the serving runs follow it.
NEWEST = max(realdata.RESULTS.glob("h200-*Z-*.json"))
# The layout cost of each decode variant against its contiguous time on the same shape.
DECODE_COST = {"splitkv": {"paged": {64: 1.18, 256: 1.04}, "varlen": 1.05},
               "sdpa_cudnn": {"paged": {64: 1.10, 256: 1.02}, "varlen": 1.12},
               "sdpa_flash": {"varlen": 1.25}}
ALGORITHM = {"splitkv": "splitkv", "fa2_mma": "fa2", "sdpa_flash": "fa2", "sdpa_cudnn": "ideal",
             "triton_fa2": "fa2", "flex_attention": "fa2"}
# TFLOP/s of the serving-grid variants per layout.
SERVING_TFLOPS = {"triton_fa2": {"dense": 260.0, "varlen": 210.0, "paged": 150.0},
                  "flex_attention": {"dense": 140.0, "varlen": 120.0, "paged": 100.0}}
LAUNCH_MS = 0.006  # a floor under every generated time
SLOWER_AT_B = 1.4  # flex_attention's paged cases at COMMIT_B
FAILS_AT_B = "triton_fa2"  # fails the first varlen case of the serving grid at B


def supports() -> dict[str, Any]:
    from harness.core.candidate import Support
    from harness.core.cases import Layout

    every = frozenset(Layout)
    return {
        "splitkv": Support(layouts=every, decode_only=True),
        "sdpa_cudnn": Support(layouts=frozenset({Layout.DENSE, Layout.PAGED})),
        "sdpa_flash": Support(layouts=frozenset({Layout.DENSE, Layout.VARLEN})),
        "fa2_mma": Support(),
        "triton_fa2": Support(layouts=every),
        "flex_attention": Support(layouts=every, window=True),
    }


def _timing(median_ms: float, key: str) -> Any:
    from harness.core.results import Timing

    rng = random.Random(zlib.crc32(key.encode()))
    samples = [median_ms * (1.0 + rng.gauss(0.0, 0.01)) for _ in range(21)]
    ordered = sorted(samples)
    return Timing(samples_ms=samples, median_ms=ordered[10], min_ms=ordered[0],
                  iqr_ms=ordered[15] - ordered[5], rel_noise=0.01, mode="cold",
                  method="generated for the dashboard tests (not a measurement)")


def _result(kernel: str, case: Any, support: Any, median_ms: float | None, tiles: dict,
            calibration: Any, *, fail: bool = False) -> Any:
    from harness.core import flops, iomodel
    from harness.core.results import CaseResult, Errors, Status
    from harness.measure.perf import annotate

    reason = support.reason_unsupported(case)
    if reason is not None:
        return CaseResult(kernel, case, Status.SKIPPED, reason)
    ratio = 9.0 if fail else 0.5 + (zlib.crc32(f"{kernel}/{case.id}".encode()) % 100) / 100
    errors = Errors(out_err=2e-4 * ratio, base_err=2e-4, floor=3e-4, ratio=ratio)
    status = Status.FAILED if fail else Status.PASSED
    message = (f"max error {errors.out_err:.3e} {'>' if fail else '<='} 2 x 2.000e-04 + "
               f"3.000e-04 (ratio {ratio:.2f})")
    res = CaseResult(kernel, case, status, message, errors,
                     flops=flops.attention_flops(case),
                     bytes_model=iomodel.hbm_bytes(ALGORITHM[kernel], case, tiles),
                     bytes_ideal=iomodel.ideal_bytes(case))
    if not fail and median_ms is not None:
        res.timing = _timing(median_ms, f"{kernel}/{case.id}")
        annotate(res, calibration, "nvidia-h200")
    return res


def _meta(base: dict[str, Any], *, hours: float, commit: str, parent: str, grids: list[str],
          kernels: dict[str, Any]) -> dict[str, Any]:
    return {"uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"serving/{commit}/{grids}")),
            "created_at": realdata._when(base, hours), "commit": commit, "parent": parent,
            "branch": "main", "source": "cli", "gpu": base["gpu"],
            "env": dict(base.get("env") or {}, synthetic=True),
            "calibration": base["calibration"], "grids": grids, "kernels": kernels}


def _tiles(kernels: dict[str, Any], name: str) -> dict:
    return dict(((kernels.get(name) or {}).get("manifest") or {}).get("tiles") or {})


def decode_run(hours: float, parent: str) -> Any:
    """The decode run at COMMIT_A (module doc)."""
    from harness.core import iomodel
    from harness.core.cases import Layout
    from harness.core.grids import get_grid
    from harness.measure.calibrate import Calibration
    from harness.records.record import RunRecord

    base = realdata.load(realdata.DECODE)
    cal = Calibration.from_dict(base["calibration"])
    dense = {(e["kernel"], e["case_id"]): e for e in base["results"]}
    sup = supports()
    results = []
    for case in get_grid("decode"):
        if case.layout is Layout.DENSE:
            continue
        twin = dataclasses.replace(case, batch=1, layout=Layout.DENSE, page_size=0,
                                   full_lengths=False)
        scale = iomodel.ideal_bytes(case) / iomodel.ideal_bytes(twin)
        for kernel in sorted(base["kernels"]):
            cost = DECODE_COST.get(kernel, {}).get(case.layout.value)
            if isinstance(cost, dict):
                cost = cost.get(case.page_size)
            ref = dense.get((kernel, twin.id))
            median = (ref["median_ms"] * scale * cost) if ref and cost else None
            results.append(_result(kernel, case, sup[kernel], median,
                                   _tiles(base["kernels"], kernel), cal))
    meta = _meta(base, hours=hours, commit=COMMIT_A, parent=parent, grids=["decode"],
                 kernels=base["kernels"])
    rec = RunRecord.from_results(results, meta)
    return rec.with_results([*base["results"], *rec.results])


def serving_run(hours: float, commit: str, parent: str, *, later: bool) -> Any:
    """A serving-grid run: SERVING_A (`later` False) or SERVING_B (module doc)."""
    from harness.core import flops
    from harness.core.grids import get_grid
    from harness.measure.calibrate import Calibration
    from harness.records.record import RunRecord

    base = realdata.load(realdata.DECODE)
    cal = Calibration.from_dict(base["calibration"])
    sup = supports()
    if later:
        sup["triton_fa2"] = dataclasses.replace(sup["triton_fa2"], window=True)
    cases = get_grid("serving")
    failing = next(c for c in cases if c.layout.value == "varlen") if later else None
    results = []
    for kernel, rates in SERVING_TFLOPS.items():
        for case in cases:
            median = LAUNCH_MS + flops.attention_flops(case) / (rates[case.layout.value] * 1e9)
            if later and kernel == "flex_attention" and case.layout.value == "paged":
                median *= SLOWER_AT_B
            results.append(_result(kernel, case, sup[kernel], median, {}, cal,
                                   fail=later and kernel == FAILS_AT_B and case == failing))
    kernels = {k: {"kind": "python", "source_hash": ""} for k in SERVING_TFLOPS}
    meta = _meta(base, hours=hours, commit=commit, parent=parent, grids=["serving"],
                 kernels=kernels)
    return RunRecord.from_results(results, meta)


def records() -> list[Any]:
    """DECODE_RUN and SERVING_A at COMMIT_A (child of the newest committed record's
    commit), SERVING_B at COMMIT_B, after every committed record."""
    decode = realdata.load(realdata.DECODE)
    newest = realdata.load(NEWEST)
    lag = (_t(newest["created_at"]) - _t(decode["created_at"])).total_seconds() / 3600
    return [decode_run(lag + 1, newest["commit"]),
            serving_run(lag + 1.1, COMMIT_A, newest["commit"], later=False),
            serving_run(lag + 2, COMMIT_B, COMMIT_A, later=True)]


def _t(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _add_serving(url: str, directory: Path) -> tuple[str, list[Any]]:
    """The serving runs imported into the database at `url`: (its URL, their records)."""
    recs = records()
    folder = directory / "serving-records"
    for i, rec in enumerate(recs):
        rec.write(folder / f"serving-{i}.json")
    return realdata.fa_import(url, folder), recs


def shared(factory: Any) -> tuple[str, list[Any]]:
    """The sample of the committed records (`realdata.SAMPLE`), then the serving runs, made
    once per test session (`realdata.shared`) from a copy of the session's shared import
    of the sample: (database URL, the serving runs' records)."""

    def make(directory: Path) -> str:
        url = realdata.copy_db(realdata.shared("sample", factory), directory)
        return _add_serving(url, directory)[0]

    # The records are made the same way every time (fixed uuids and seeds).
    return realdata.shared("serving", factory, make), records()
