"""The runner's own ceilings, measured with the timing method: device copy bandwidth and
fp16/bf16 matmul throughput, kept with the runner's identity in a JSON file.

Datasheet peaks overstate what any kernel reaches (the H200 sheet says 989 dense fp16
TFLOP/s; an 8192^3 cuBLAS matmul reaches about 670), so "% of roofline" and the scoring
time floor use these measured ceilings instead.

- copy bandwidth: `dst.copy_(src)` of a large buffer (at least 1 GiB and 16 x L2), counted
  as bytes read + bytes written over the median time, in GB/s (1e9 bytes/s);
- matmul: `torch.matmul` of 8192 x 8192 x 8192 random normal inputs (not zeros, whose
  power draw and clocks differ) per dtype, 2 * 8192^3 FLOP over the median time.

File: `~/.cache/fa-harness/calibration-<gpu uuid>.json` unless told otherwise
(`--out`, or the FA_HARNESS_CALIBRATION environment variable for `load_calibration`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.measure.gpuinfo import GpuIdentity, gpu_identity

FORMAT_VERSION = 1
MATMUL_N = 8192
COPY_MIN_BYTES = 1 << 30
ENV_PATH = "FA_HARNESS_CALIBRATION"


class CalibrationError(ValueError):
    """A calibration file that is missing, unreadable or malformed (one-line message)."""


@dataclass
class Calibration:
    gpu: GpuIdentity
    copy_gbps: float  # read + write bytes per second / 1e9
    matmul_tflops_by_dtype: dict[str, float]
    created: str = ""
    timings: dict[str, Any] = field(default_factory=dict)  # median ms, noise, method
    version: int = FORMAT_VERSION

    @property
    def matmul_tflops(self) -> float:
        """The fp16 rate (the roofline's compute ceiling when no dtype is given)."""
        return self.matmul_tflops_by_dtype.get("float16") or max(
            self.matmul_tflops_by_dtype.values())

    def ceilings(self, dtype: str = "float16"):
        """harness.core.iomodel.Ceilings for one dtype (falls back to the fp16 rate)."""
        from harness.core.iomodel import Ceilings

        return Ceilings(self.copy_gbps,
                        self.matmul_tflops_by_dtype.get(dtype, self.matmul_tflops))

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "created": self.created,
            "gpu": self.gpu.to_dict(),
            "gpu_model_key": self.gpu.model_key,
            # Top-level copy_gbps / matmul_tflops are what iomodel.Ceilings.from_dict reads.
            "copy_gbps": self.copy_gbps,
            "matmul_tflops": self.matmul_tflops,
            "matmul_tflops_by_dtype": dict(self.matmul_tflops_by_dtype),
            "timings": self.timings,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        if not isinstance(d, dict):
            raise CalibrationError("calibration must be a JSON object")
        missing = [k for k in ("gpu", "copy_gbps", "matmul_tflops_by_dtype") if k not in d]
        if missing:
            raise CalibrationError(f"calibration is missing {', '.join(missing)}")
        if d.get("version", FORMAT_VERSION) > FORMAT_VERSION:
            raise CalibrationError(f"calibration format {d['version']} is newer than "
                                   f"supported ({FORMAT_VERSION})")
        try:
            rates = {str(k): float(v) for k, v in dict(d["matmul_tflops_by_dtype"]).items()}
            copy = float(d["copy_gbps"])
        except (TypeError, ValueError) as e:
            raise CalibrationError(f"calibration has a non-numeric rate: {e}") from None
        if not rates or copy <= 0 or any(v <= 0 for v in rates.values()):
            raise CalibrationError("calibration rates must be positive")
        return cls(gpu=GpuIdentity.from_dict(d["gpu"] or {}), copy_gbps=copy,
                   matmul_tflops_by_dtype=rates, created=str(d.get("created", "")),
                   timings=dict(d.get("timings") or {}), version=int(d.get("version", 1)))

    def save(self, path: Path | str) -> Path:
        """Write atomically (temp file + rename): a crash never leaves half a file."""
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
        return path


def default_path(uuid: str | None) -> Path:
    safe = (uuid or "unknown").replace("/", "_")
    return Path("~/.cache/fa-harness").expanduser() / f"calibration-{safe}.json"


def read_calibration(path: Path | str) -> Calibration:
    path = Path(path).expanduser()
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CalibrationError(f"no calibration file at {path}") from None
    except OSError as e:
        raise CalibrationError(f"cannot read {path}: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CalibrationError(f"{path} is not valid JSON (line {e.lineno}: {e.msg})") from None
    try:
        return Calibration.from_dict(data)
    except CalibrationError as e:
        raise CalibrationError(f"{path}: {e}") from None


def load_calibration(path: Path | str | None = None, *, uuid: str | None = None
                     ) -> Calibration | None:
    """The calibration for this runner, or None when there is none yet.

    An explicit path (argument or FA_HARNESS_CALIBRATION) must exist and be valid
    (CalibrationError otherwise); the default per-GPU file may simply be absent."""
    explicit = path or os.environ.get(ENV_PATH)
    if explicit:
        return read_calibration(explicit)
    if uuid is None:
        ident = gpu_identity()
        uuid = ident.uuid
        if uuid is None:
            return None
    p = default_path(uuid)
    return read_calibration(p) if p.exists() else None


# ---------------------------------------------------------------- measuring (GPU)


def _timing_summary(t) -> dict[str, Any]:
    return {"median_ms": t.median_ms, "min_ms": t.min_ms, "rel_noise": t.rel_noise,
            "samples": len(t.samples_ms), "dropped_throttled": t.dropped_throttled,
            "method": t.method}


def measure_copy_gbps(nbytes: int | None = None) -> tuple[float, dict[str, Any]]:
    import torch

    from harness.measure.timing import time_callable

    l2 = int(getattr(torch.cuda.get_device_properties(), "L2_cache_size", 0))
    nbytes = nbytes or max(COPY_MIN_BYTES, 16 * l2)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = time_callable(lambda: dst.copy_(src))
    if not t.median_ms:
        raise RuntimeError(f"copy timing gave no valid sample ({t.method})")
    gbps = 2 * nbytes / (t.median_ms * 1e-3) / 1e9
    info = _timing_summary(t) | {"bytes": nbytes}
    return gbps, info


def measure_matmul_tflops(dtype: str, n: int = MATMUL_N) -> tuple[float, dict[str, Any]]:
    import torch

    from harness.core.cases import DTYPES
    from harness.measure.timing import time_callable

    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    a = torch.randn((n, n), generator=gen, device="cuda", dtype=torch.float32).to(DTYPES[dtype])
    b = torch.randn((n, n), generator=gen, device="cuda", dtype=torch.float32).to(DTYPES[dtype])
    c = torch.empty_like(a)
    t = time_callable(lambda: torch.matmul(a, b, out=c))
    if not t.median_ms:
        raise RuntimeError(f"matmul timing gave no valid sample ({t.method})")
    tflops = 2 * n**3 / (t.median_ms * 1e-3) / 1e12
    return tflops, _timing_summary(t) | {"n": n}


def calibrate(dtypes: tuple[str, ...] = ("float16", "bfloat16")) -> Calibration:
    """Measure this runner's ceilings (needs a CUDA GPU)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU available (torch.cuda.is_available() is False)")
    ident = gpu_identity()
    copy, copy_info = measure_copy_gbps()
    rates: dict[str, float] = {}
    timings: dict[str, Any] = {"copy": copy_info}
    for dt in dtypes:
        rates[dt], timings[f"matmul_{dt}"] = measure_matmul_tflops(dt)
    return Calibration(gpu=ident, copy_gbps=copy, matmul_tflops_by_dtype=rates,
                       created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), timings=timings)
