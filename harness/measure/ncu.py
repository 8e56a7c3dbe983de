"""DRAM bytes a candidate really moves, measured by Nsight Compute.

`measure_bytes(candidate, case)` runs

    ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
        --cache-control all --clock-control none --profile-from-start off
        --csv --print-units base [-k regex:<entries>]
        python -m harness.measure.ncu_target --kernel NAME --case ID

The target program launches the candidate once to warm up (compiles, plans, allocations),
then once more between cudaProfilerStart/Stop, so only that call's kernels are profiled;
for CUDA variants `-k` also restricts profiling to the entries the variant declares
(`meta["entries"]`), leaving out harness-side helper kernels. Rows are summed over the
profiled kernels. `--cache-control all` flushes caches before each kernel, so reads are
cold; writes still resident in L2 when a kernel ends are not counted (the 60 MB L2 of an
H200 hides them for small problems), so meaningful bytes need shapes several times larger
than the L2.

ncu missing, or refusing the device (ERR_NVGPUCTRPERM: no permission for performance
counters; "LibraryNotLoaded"), is one line in `NcuResult.error`; the caller's run goes on
with the column empty.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")
DEFAULT_TIMEOUT_S = 600.0

_BYTE_UNITS = {"byte": 1, "bytes": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
               "kibyte": 2**10, "mibyte": 2**20, "gibyte": 2**30}
_TIME_UNITS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6,
               "ms": 1e6, "second": 1e9, "s": 1e9}


@dataclass
class NcuResult:
    read_bytes: int | None = None
    write_bytes: int | None = None
    time_ns: float | None = None
    kernels: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.read_bytes is not None


def parse_number(text: str) -> float | None:
    """"1,234,567.5" -> 1234567.5; "n/a" or "" -> None."""
    t = text.strip().replace(",", "")
    if not t or t.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def _scale(unit: str, value: float, metric: str) -> float:
    u = unit.strip().lower()
    table = _TIME_UNITS if metric.startswith("gpu__time") else _BYTE_UNITS
    if u in table:
        return value * table[u]
    if not u:
        return value
    raise ValueError(f"unknown unit {unit!r} for {metric}")


def parse_csv(text: str) -> NcuResult:
    """Parse ncu's `--csv` details output (one row per kernel x metric, columns "Kernel
    Name", "Metric Name", "Metric Unit", "Metric Value"); lines that are not CSV (the
    program's own output, "==PROF==" messages) are ignored."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return NcuResult(error=_diagnose(text) or "ncu produced no CSV rows (no kernel profiled)")
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    need = {"Metric Name", "Metric Value"}
    if not rows or not need <= set(rows[0]):
        return NcuResult(error="ncu CSV has no 'Metric Name'/'Metric Value' columns")
    totals: dict[str, float] = {}
    kernels: list[str] = []
    seen_ids: set[str] = set()
    for r in rows:
        name = r.get("Metric Name", "")
        if name not in METRICS:
            continue
        value = parse_number(r.get("Metric Value", ""))
        if value is None:
            continue
        totals[name] = totals.get(name, 0.0) + _scale(r.get("Metric Unit", ""), value, name)
        kid = r.get("ID", str(len(seen_ids)))
        if kid not in seen_ids:
            seen_ids.add(kid)
            kernels.append(r.get("Kernel Name", "?"))
    if "dram__bytes_read.sum" not in totals:
        return NcuResult(error="ncu output has no dram__bytes_read.sum values")
    return NcuResult(
        read_bytes=int(round(totals["dram__bytes_read.sum"])),
        write_bytes=int(round(totals.get("dram__bytes_write.sum", 0.0))),
        time_ns=totals.get("gpu__time_duration.sum"),
        kernels=kernels,
    )


def _diagnose(output: str) -> str | None:
    """One line for the known ways ncu refuses to work."""
    if "ERR_NVGPUCTRPERM" in output:
        return ("ncu has no permission to read GPU performance counters (ERR_NVGPUCTRPERM); "
                "run as root or set NVreg_RestrictProfilingToAdminUsers=0")
    if "LibraryNotLoaded" in output:
        return "ncu could not load its injection library (LibraryNotLoaded)"
    if "No kernels were profiled" in output:
        return "ncu profiled no kernel (name filter matched nothing?)"
    m = re.search(r"==ERROR==\s*(.+)", output)
    if m:
        return f"ncu error: {m.group(1).strip()}"
    return None


def ncu_path() -> str | None:
    return os.environ.get("FA_HARNESS_NCU") or shutil.which("ncu")


def command(candidate_name: str, case_id: str, *, entries: list[str] | None = None,
            variant_path: str | None = None, ncu: str = "ncu",
            sandboxed: bool = False) -> list[str]:
    cmd = [ncu, "--metrics", ",".join(METRICS), "--cache-control", "all",
           "--clock-control", "none", "--profile-from-start", "off", "--csv",
           "--print-units", "base"]
    if entries:
        cmd += ["-k", "regex:^(" + "|".join(re.escape(e) for e in entries) + ")$"]
    cmd += [sys.executable, "-m", "harness.measure.ncu_target", "--kernel", candidate_name,
            "--case", case_id]
    if variant_path:
        cmd += ["--variant", variant_path]
    if sandboxed:
        cmd += ["--sandboxed-build"]
    return cmd


def measure_bytes(candidate, case, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                  variant_path: str | None = None, sandboxed: bool = False) -> NcuResult:
    """Profile one launch of `candidate` on `case`. Never raises: problems are `.error`."""
    exe = ncu_path()
    if exe is None:
        return NcuResult(error="ncu (Nsight Compute) not found on PATH; measured bytes skipped")
    entries = list(candidate.meta.get("entries") or []) if candidate.kind == "cuda" else []
    cmd = command(candidate.name, case.id, entries=entries, variant_path=variant_path, ncu=exe,
                  sandboxed=sandboxed)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return NcuResult(error=f"ncu did not finish within {timeout_s:g} s")
    except OSError as e:
        return NcuResult(error=f"cannot run ncu: {e.strerror}")
    output = proc.stdout + "\n" + proc.stderr
    known = _diagnose(output)
    if known:
        return NcuResult(error=known)
    res = parse_csv(proc.stdout)
    if res.error and proc.returncode != 0:
        tail = [ln for ln in output.splitlines() if ln.strip()][-1:] or [""]
        res.error = f"{res.error} (exit {proc.returncode}: {tail[0][:200]})"
    return res
