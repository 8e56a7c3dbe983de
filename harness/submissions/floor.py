"""The physical floor of a timed call: no kernel can finish a case faster than its FLOPs at the
matmul peak or its ideal bytes at the copy bandwidth, so a faster sample is impossible.
"""

from __future__ import annotations

from harness.core.cases import Case
from harness.submissions.timed import (
    ScoringOptions,
)

# ----------------------------------------------------------------------------- floor


def runner_ceilings(options: ScoringOptions, dtype: str) -> tuple[dict[str, float], str]:
    """(ceilings, where they came from): options, else the runner's calibration, else the
    datasheet of the GPU (higher than measured ceilings, so only a lower floor)."""
    if options.ceilings:
        return dict(options.ceilings), "options"
    try:
        from harness.measure.calibrate import load_calibration

        cal = load_calibration()
    except Exception:  # noqa: BLE001 - no calibration module or file: fall back below
        cal = None
    if cal is not None:
        c = cal.ceilings(dtype)
        return {"copy_gbps": c.copy_gbps, "matmul_tflops": c.matmul_tflops}, "calibration"
    from harness.core.iomodel import GPU_SPECS

    spec = GPU_SPECS["h200"]
    return {"copy_gbps": spec.hbm_tbps * 1000, "matmul_tflops": spec.tflops_fp16}, \
        "datasheet h200 (runner not calibrated)"


def floor_ms(case: Case, ceilings: dict[str, float]) -> float:
    from harness.core.flops import attention_flops
    from harness.core.iomodel import Ceilings, ideal_bytes, roofline_floor_ms

    return roofline_floor_ms(attention_flops(case), ideal_bytes(case),
                             Ceilings.from_dict(ceilings))
