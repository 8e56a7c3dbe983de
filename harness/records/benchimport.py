"""Turn a pytest-benchmark `--benchmark-json` file into a run record.

Each benchmark names its kernel and case through `extra_info` (preferred: `kernel`,
`case_id`, optionally `status`, `tflops`, `flops`) or its parametrisation (`params`:
`kernel`/`candidate`, `case`/`case_id` as a Case id string or a Case). Timings come from
`stats.data` (raw rounds, present with --benchmark-save-data... and always in our suites)
or, failing that, the summary stats; pytest-benchmark reports seconds, records hold ms.
The record uuid is derived from the file's content, so importing a file twice stores it
once.
"""

from __future__ import annotations

import hashlib
import json
import uuid as uuidlib
from typing import Any

from harness.core.cases import Case
from harness.records.record import RecordError, RunRecord, gpu_model_key, iso_utc, parse_time

_NS = uuidlib.UUID("6d1f0f4e-3c8a-4b7e-9a51-0f6b2c7d8e90")


def looks_like_benchmark_json(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("benchmarks"), list) \
        and "machine_info" in data


def _case_of(b: dict[str, Any], where: str) -> Case:
    extra = b.get("extra_info") or {}
    params = b.get("params") or {}
    raw = extra.get("case_id") or extra.get("case") or params.get("case_id") \
        or params.get("case")
    if raw is None:
        raise RecordError(f"{where}: no case (set extra_info['case_id'] or a 'case' param)")
    try:
        if isinstance(raw, dict):
            return Case.from_dict(raw)
        return Case.from_id(str(raw))
    except ValueError as exc:
        raise RecordError(f"{where}: {exc}") from None


def _kernel_of(b: dict[str, Any], where: str) -> str:
    extra = b.get("extra_info") or {}
    params = b.get("params") or {}
    k = extra.get("kernel") or params.get("kernel") or params.get("candidate")
    if not k:
        raise RecordError(f"{where}: no kernel (set extra_info['kernel'] or a 'kernel' param)")
    return str(k)


def record_from_benchmark_json(data: dict[str, Any], *, text: str | None = None) -> RunRecord:
    if not looks_like_benchmark_json(data):
        raise RecordError("not a pytest-benchmark JSON file (no 'benchmarks'/'machine_info')")
    entries = []
    for i, b in enumerate(data["benchmarks"]):
        where = f"benchmarks[{i}] ({b.get('fullname') or b.get('name') or '?'})"
        st = b.get("stats")
        if not isinstance(st, dict):
            raise RecordError(f"{where}.stats: missing")
        extra = b.get("extra_info") or {}
        case = _case_of(b, where)
        samples = [float(x) * 1e3 for x in (st.get("data") or [])]
        median = st.get("median")
        if median is None and not samples:
            raise RecordError(f"{where}.stats.median: missing")
        median_ms = float(median) * 1e3 if median is not None else None
        flops = extra.get("flops")
        tflops = extra.get("tflops")
        if tflops is None and flops and median_ms:
            tflops = float(flops) / (median_ms * 1e-3) / 1e12
        entries.append({
            "kernel": _kernel_of(b, where), "case": case.to_dict(), "case_id": case.id,
            "status": str(extra.get("status") or "passed"), "message": "",
            "errors": {}, "samples_ms": samples, "median_ms": median_ms,
            "min_ms": float(st["min"]) * 1e3 if st.get("min") is not None else None,
            "iqr_ms": float(st["iqr"]) * 1e3 if st.get("iqr") is not None else None,
            "rel_noise": (float(st["stddev"]) / float(st["mean"])) if st.get("stddev")
            and st.get("mean") else None,
            "dropped_throttled": 0, "timing_mode": extra.get("timing_mode"),
            "timing_method": "pytest-benchmark", "flops": flops, "tflops": tflops,
            "bytes": {}, "registers": None, "spills": None, "shared_bytes": None,
            "extra": {"benchmark": b.get("fullname") or b.get("name"),
                      **({"group": b["group"]} if b.get("group") else {})},
        })
    machine = data.get("machine_info") or {}
    commit_info = data.get("commit_info") or {}
    gpu = machine.get("fa_harness_gpu") or machine.get("gpu")
    if isinstance(gpu, dict):
        gpu = dict(gpu)
        gpu.setdefault("model_key", gpu_model_key(gpu.get("name")))
    else:
        gpu = None
    created = data.get("datetime")
    try:
        created_at = iso_utc(parse_time(created)) if created else None
    except ValueError:
        raise RecordError(f"datetime: {created!r} is not an ISO 8601 time") from None
    digest = hashlib.sha256((text if text is not None else
                             json.dumps(data, sort_keys=True)).encode()).hexdigest()
    rec = RunRecord(
        uuid=str(uuidlib.uuid5(_NS, digest)),
        created_at=created_at or "1970-01-01T00:00:00.000000Z",
        commit=commit_info.get("id"), gpu=gpu, results=[],
        branch=commit_info.get("branch"), source="benchmark",
        env={"python": machine.get("python_version"), "hostname": machine.get("node"),
             "pytest_benchmark": data.get("version"),
             "dirty": commit_info.get("dirty")},
        grids=["pytest-benchmark"])
    return rec.with_results(entries)
