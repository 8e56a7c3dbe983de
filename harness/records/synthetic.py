"""Synthetic run records: timings drawn from a known distribution, for tests, demos and
the detection-power bench. Nothing here is ever presented as a measurement: records made
here carry `env.synthetic = true`."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from harness.core.cases import Case, MaskKind
from harness.records.record import RunRecord

DEFAULT_CASES = (
    Case(2, 4, 4, 128, 128, 64, "float16", MaskKind.NONE),
    Case(2, 4, 4, 113, 203, 64, "float16", MaskKind.CAUSAL_BR),
    Case(1, 8, 2, 256, 256, 128, "bfloat16", MaskKind.CAUSAL_TL),
)
H200 = {"name": "NVIDIA H200", "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "driver": "580.159.04", "cuda_driver_version": "13.0", "sm_clock_mhz": 1980}


@dataclass
class Spec:
    """One (kernel, case) of a synthetic run."""

    kernel: str
    case: Case
    median_ms: float = 1.0
    noise: float = 0.015  # relative sd of each sample
    samples: int = 20
    status: str = "passed"
    err_ratio: float = 0.8


def entry(spec: Spec, rng: random.Random) -> dict[str, Any]:
    samples = [spec.median_ms * (1.0 + rng.gauss(0.0, spec.noise)) for _ in range(spec.samples)]
    samples = [max(s, 1e-6) for s in samples]
    ordered = sorted(samples)
    med = ordered[len(ordered) // 2] if samples else None
    flops = 4 * spec.case.batch * spec.case.heads * spec.case.seqlen_q * spec.case.seqlen_k \
        * spec.case.head_dim
    return {
        "kernel": spec.kernel, "case": spec.case.to_dict(), "case_id": spec.case.id,
        "status": spec.status, "message": "" if spec.status == "passed" else "synthetic failure",
        "errors": {"out_err": 1e-3 * spec.err_ratio, "base_err": 1e-3, "ratio": spec.err_ratio,
                   "lse_err": 1e-5},
        "samples_ms": samples, "median_ms": med, "min_ms": ordered[0] if samples else None,
        "iqr_ms": (ordered[3 * len(ordered) // 4] - ordered[len(ordered) // 4]) if samples
        else None,
        "rel_noise": spec.noise, "dropped_throttled": 0, "timing_mode": "cold",
        "timing_method": "synthetic", "flops": flops,
        "tflops": flops / (med * 1e-3) / 1e12 if med else None,
        "bytes": {"model": 1 << 20, "ideal": 1 << 19, "read": None, "write": None},
        "registers": 128, "spills": 0, "shared_bytes": 49152, "extra": {},
    }


def make_record(specs: Sequence[Spec], *, seed: int = 0, commit: str = "c0" * 20,
                parent: str | None = None, branch: str = "main",
                gpu: dict[str, Any] | None = None, created_at: datetime | None = None,
                source: str = "ci", minutes: int = 0) -> RunRecord:
    """A valid record of `specs` (timings drawn with `seed`)."""
    rng = random.Random(seed)
    when = (created_at or datetime(2026, 12, 1, tzinfo=UTC)) + timedelta(minutes=minutes)
    g = dict(H200 if gpu is None else gpu) if gpu != {} else None
    kernels = {s.kernel: {"kind": "cuda", "source_hash": f"hash-{s.kernel}"} for s in specs}
    return RunRecord.from_results([], {
        "uuid": str(_uuid(rng)), "created_at": when.isoformat().replace("+00:00", "Z"),
        "commit": commit, "parent": parent, "branch": branch, "source": source, "gpu": g,
        "env": {"synthetic": True, "python": "3.11", "hostname": "synthetic"},
        "grids": ["synthetic"], "kernels": kernels,
    }).with_results([entry(s, rng) for s in specs])


def _uuid(rng: random.Random) -> Any:
    import uuid

    return uuid.UUID(int=rng.getrandbits(128), version=4)


def specs_for(kernels: Sequence[str] = ("fa2", "naive"), cases: Sequence[Case] = DEFAULT_CASES,
              **kw: Any) -> list[Spec]:
    return [Spec(k, c, median_ms=1.0 + 0.1 * i, **kw)
            for i, (k, c) in enumerate((k, c) for k in kernels for c in cases)]
