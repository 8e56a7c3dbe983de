"""Outcome of one (candidate, case): status, errors, timing and bytes.

These dataclasses are what every layer passes around: the runner fills them, the record
serialises them, the database stores them, the gate compares them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from harness.core.cases import Case


class Status(StrEnum):
    PASSED = "passed"
    FAILED = "failed"  # ran, wrong answer (tolerance, NaN, unwritten output, guard zone, ...)
    SKIPPED = "skipped"  # the candidate does not support the case (reason in message)
    CRASHED = "crashed"  # illegal address, segfault, CUDA error: the child process died
    TIMEOUT = "timeout"  # the child process hung past its deadline
    ERROR = "error"  # harness-side problem before running: bad manifest, compile error
    INVALID = "invalid"  # measured faster than physically possible on this runner

    @property
    def ok(self) -> bool:
        return self in (Status.PASSED, Status.SKIPPED)


@dataclass
class Errors:
    """Errors against the float64 oracle. `ratio` = out_err / base_err, the metric the
    tolerance rule bounds (<= 2) and the dashboard tracks as precision drift."""

    out_err: float | None = None  # max |out - ref|
    base_err: float | None = None  # max |naive same-precision - ref|
    floor: float | None = None  # data-derived absolute floor
    ratio: float | None = None
    lse_err: float | None = None
    lse_base_err: float | None = None
    worst_index: list[int] | None = None


@dataclass
class Timing:
    """Device-time statistics of one measurement (milliseconds). Raw samples are kept."""

    samples_ms: list[float] = field(default_factory=list)
    median_ms: float | None = None
    min_ms: float | None = None
    iqr_ms: float | None = None
    rel_noise: float | None = None
    dropped_throttled: int = 0
    mode: str = "cold"
    method: str = ""
    # The median SM clock (NVML) over the kept samples. A median that moves between runs
    # with no change to the code may be the clock's doing, not the kernel's: recorded so
    # that the run-to-run noise can be traced to it (docs/regressions.md).
    sm_clock_mhz: float | None = None


@dataclass
class CaseResult:
    kernel: str
    case: Case
    status: Status
    message: str = ""
    errors: Errors = field(default_factory=Errors)
    timing: Timing | None = None
    flops: int | None = None
    tflops: float | None = None
    bytes_model: int | None = None  # IO model bytes for the candidate's algorithm
    bytes_ideal: int | None = None  # Q, K, V, O once
    bytes_measured_read: int | None = None  # Nsight Compute DRAM bytes
    bytes_measured_write: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pass_name(self) -> str:
        """The pass judged: "fwd" (the forward) or "bwd" (the backward)."""
        return str(self.extra.get("pass", "fwd"))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["case"] = self.case.to_dict()
        d["case_id"] = self.case.id
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaseResult:
        timing = d.get("timing")
        return cls(
            kernel=d["kernel"],
            case=Case.from_dict(d["case"]),
            status=Status(d["status"]),
            message=d.get("message", ""),
            errors=Errors(**(d.get("errors") or {})),
            timing=Timing(**timing) if timing else None,
            flops=d.get("flops"),
            tflops=d.get("tflops"),
            bytes_model=d.get("bytes_model"),
            bytes_ideal=d.get("bytes_ideal"),
            bytes_measured_read=d.get("bytes_measured_read"),
            bytes_measured_write=d.get("bytes_measured_write"),
            extra=d.get("extra") or {},
        )
