"""The perf run's results as a table: one row per (case, candidate), median device time,
noise, TFLOP/s, speed-up over the baseline, the IO model's and the ideal bytes, Nsight
Compute's bytes when measured, K+V bandwidth for decode shapes, and the share of the
roofline (harness.measure.perf puts these in each result's `extra`)."""

from __future__ import annotations

from collections.abc import Sequence
from io import StringIO
from typing import Any

from harness.core.results import CaseResult, Status
from harness.measure.perf import _saved_calibration, is_decode


def _mib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**20:,.1f}"


def perf_table(results: Sequence[CaseResult], baseline: str = "sdpa_flash",
               calibration: Any | None = None):
    """The perf results as a rich Table."""
    from rich.table import Table

    from harness.measure.gpuinfo import describe

    if calibration is None and any(r.extra.get("ceilings") == "measured" for r in results):
        calibration = _saved_calibration()  # run_perf used the saved file: say so
    decode = any(is_decode(r.case) for r in results)
    measured = any(r.bytes_measured_read is not None for r in results)
    if calibration is not None:
        rates = "/".join(f"{v:.0f}" for v in calibration.matmul_tflops_by_dtype.values())
        caption = (f"roofline: measured ceilings on {describe(calibration.gpu)}: copy "
                   f"{calibration.copy_gbps:.0f} GB/s, matmul {rates} TFLOP/s")
    else:
        caption = "roofline: no calibration (run `fa-harness calibrate`); datasheet if known"
    t = Table(title=f"perf (median device time; x = speedup over {baseline})", caption=caption)
    t.add_column("case", overflow="fold")  # long ids fold; candidate names stay whole
    t.add_column("candidate", no_wrap=True)
    t.add_column("status", max_width=48)
    for col in ("median ms", "noise", "TFLOP/s", f"x {baseline}", "model MiB", "ideal MiB"):
        t.add_column(col, justify="right")
    if measured:
        t.add_column("ncu rd+wr MiB", justify="right")
    if decode:
        t.add_column("K+V GB/s", justify="right")
    t.add_column("% roofline", justify="right")
    for r in results:
        tm = r.timing
        ok = r.status is Status.PASSED and tm is not None and tm.median_ms
        status = r.status.value
        if not ok and r.message:
            status += ": " + r.message.strip().splitlines()[0][:60]
        row = [
            r.case.id, r.kernel, status,
            f"{tm.median_ms:.4f}" if ok else "",
            f"{tm.rel_noise:.2%}" if ok and tm.rel_noise is not None else "",
            f"{r.tflops:.1f}" if r.tflops is not None else "",
            f"{r.extra['vs_baseline']:.2f}" if "vs_baseline" in r.extra else "",
            _mib(r.bytes_model), _mib(r.bytes_ideal),
        ]
        if measured:
            rw = (None if r.bytes_measured_read is None
                  else r.bytes_measured_read + (r.bytes_measured_write or 0))
            row.append(_mib(rw))
        if decode:
            row.append(f"{r.extra['kv_gbps']:.0f}" if "kv_gbps" in r.extra else "")
        row.append(f"{r.extra['roofline_pct']:.0f}%" if "roofline_pct" in r.extra else "")
        t.add_row(*row)
    return t


def format_table(results: Sequence[CaseResult], baseline: str = "sdpa_flash",
                 calibration: Any | None = None, width: int = 180) -> str:
    """`perf_table` rendered to plain text (printable with print())."""
    from rich.console import Console

    buf = StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(
        perf_table(results, baseline, calibration))
    return buf.getvalue()
