"""How fast a timed call can possibly be, and what a faster one means.

Two levels, both max(FLOPs / compute ceiling, ideal HBM bytes / bandwidth ceiling):

* the **physical floor**, from the datasheet of the runner's GPU (`iomodel.GPU_SPECS`:
  dense tensor-core peak of the case's input precision, FP8's for e4m3 inputs
  (`GpuSpec.peak_tflops`), and HBM bandwidth, sources in the table): nothing runs faster, so
  a sample below it (less `floor_slack`, for the timer's resolution) is `invalid`. A GPU
  missing from the table has no floor, and the report says so;
* the **runner's own ceilings**, measured (`harness.measure.calibrate`: copy GB/s, matmul
  TFLOP/s), which honest kernels can beat (cuDNN's decode reads K/V faster than a plain copy
  on the H200; an FA3-class kernel beats a plain matmul): a sample between the two floors is
  scored but marked `suspicious`, and re-checked with Nsight Compute where it is installed
  (`ncu_recheck`: the DRAM bytes the kernel read must be at least the ideal bytes that do
  not fit in L2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.core.cases import Case
from harness.core.iomodel import GpuSpec, datasheet_for
from harness.submissions.timed import ScoringOptions


@dataclass
class Floors:
    physical_ms: float | None  # datasheet floor; None: unknown GPU
    measured_ms: float | None  # the runner's measured ceilings; None: not calibrated
    gpu: str  # datasheet entry, or why there is none
    measured_source: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def device_name(device: str) -> str:
    import torch

    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "cpu"
    return torch.cuda.get_device_name(torch.device(device))


def datasheet(options: ScoringOptions, name: str) -> GpuSpec | None:
    if options.datasheet:
        d = options.datasheet
        fp8 = d.get("tflops_fp8")
        return GpuSpec(str(d.get("name", "options")), float(d["tflops_fp16"]),
                       float(d["hbm_tbps"]), int(d.get("l2_bytes", 0)),
                       tflops_fp8=None if fp8 is None else float(fp8))
    return datasheet_for(name)


def measured_ceilings(options: ScoringOptions, dtype: str) -> tuple[dict[str, float] | None, str]:
    """(ceilings, where they came from): options, else the runner's calibration, else None."""
    if options.ceilings:
        return dict(options.ceilings), "options"
    try:
        from harness.measure.calibrate import load_calibration

        cal = load_calibration()
    except Exception:  # noqa: BLE001 - no calibration module or file
        cal = None
    if cal is None:
        return None, "runner not calibrated"
    c = cal.ceilings(dtype)
    return {"copy_gbps": c.copy_gbps, "matmul_tflops": c.matmul_tflops}, "calibration"


def floor_ms(case: Case, ceilings: dict[str, float], *, backward: bool = False) -> float:
    """The roofline floor of the case's forward, or (`backward`) of its backward: the
    backward's FLOPs (five products per visible pair) and ideal bytes
    (harness.core.iomodel_bwd)."""
    from harness.core.flops import attention_bwd_flops, attention_flops
    from harness.core.iomodel import Ceilings, ideal_bytes, roofline_floor_ms
    from harness.core.iomodel_bwd import ideal_bytes_bwd

    if backward:
        return roofline_floor_ms(attention_bwd_flops(case), ideal_bytes_bwd(case),
                                 Ceilings.from_dict(ceilings))
    return roofline_floor_ms(attention_flops(case), ideal_bytes(case),
                             Ceilings.from_dict(ceilings))


def floors(case: Case, options: ScoringOptions, gpu_name: str, *,
           backward: bool = False) -> Floors:
    spec = datasheet(options, gpu_name)
    # The compute ceiling of the case's precision: fp16's would put the floor of an FP8
    # case twice too high on Hopper and call a fast, honest FP8 kernel invalid. (The
    # measured ceilings stay the calibration's fp16/bf16 matmul: an FP8 case faster than
    # those is suspicious, and re-checked, not invalid.)
    physical = None if spec is None else floor_ms(
        case, {"copy_gbps": spec.hbm_tbps * 1000, "matmul_tflops": spec.peak_tflops(case)},
        backward=backward)
    ceilings, source = measured_ceilings(options, case.dtype)
    measured = None if ceilings is None else floor_ms(case, ceilings, backward=backward)
    label = spec.name if spec else f"no datasheet entry for {gpu_name!r}: no physical floor"
    return Floors(physical, measured, label, source)


@dataclass
class FloorVerdict:
    verdict: str  # "ok", "suspicious" or "invalid"
    message: str


def judge(min_ms: float, f: Floors, slack: float) -> FloorVerdict:
    """`invalid` below the physical floor (less `slack`), `suspicious` below the runner's
    measured floor, else ok."""
    if f.physical_ms is not None and min_ms < f.physical_ms * (1.0 - slack):
        return FloorVerdict("invalid", f"measured {min_ms:.4f} ms, below the physical floor "
                            f"{f.physical_ms:.4f} ms of this GPU ({f.gpu} datasheet: FLOPs at "
                            f"the dense tensor-core peak, ideal bytes at the HBM bandwidth)")
    if f.measured_ms is not None and min_ms < f.measured_ms:
        return FloorVerdict("suspicious", f"measured {min_ms:.4f} ms, faster than this "
                            f"runner's measured ceilings allow ({f.measured_ms:.4f} ms, "
                            f"{f.measured_source}) but above the physical floor")
    return FloorVerdict("ok", "")


def unfit_ideal_bytes(case: Case, l2_bytes: int) -> int:
    """Ideal HBM bytes a kernel must read from DRAM even with a warm L2: what does not fit.
    Nsight Compute runs with `--cache-control all` (L2 flushed), so this is a lower bound."""
    from harness.core.iomodel import hbm_breakdown

    reads = sum(v for k, v in hbm_breakdown("ideal", case).items() if k.startswith("read"))
    return max(0, reads - l2_bytes)


def ncu_recheck(candidate: Any, case: Case, variant_path: str | None, l2_bytes: int,
                timeout_s: float = 120.0) -> dict[str, Any]:
    """Profile one launch with Nsight Compute: DRAM bytes read must be at least the ideal
    bytes that do not fit in L2. Returns {"status": "passed"|"failed"|"skipped", ...}."""
    from harness.measure.ncu import measure_bytes

    need = unfit_ideal_bytes(case, l2_bytes)
    res = measure_bytes(candidate, case, timeout_s=timeout_s, variant_path=variant_path,
                        sandboxed=True)
    if not res.ok:
        return {"status": "skipped", "reason": res.error, "need_read_bytes": need}
    ok = (res.read_bytes or 0) >= need
    return {"status": "passed" if ok else "failed", "read_bytes": res.read_bytes,
            "need_read_bytes": need}
