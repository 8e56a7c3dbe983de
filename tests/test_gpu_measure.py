"""Measurement on a real GPU: the timing method, calibration, identity, peers, isolation of
a CUDA fault, the perf run and the pytest-benchmark front. Skipped without CUDA.

    pytest tests/test_gpu_measure.py -m gpu -v
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from harness.core.candidate import Candidate
from harness.core.cases import Case
from harness.core.results import Status

# `exclusive`: these measure time, so `make test-gpu` runs them with the GPU to themselves.
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.exclusive,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
ROOT = Path(__file__).resolve().parent.parent
QUICK = {"min_samples": 10, "min_time_s": 0.1, "max_time_s": 3.0}


def quick():
    from harness.measure.timing import StopRule

    return StopRule(**QUICK)


def test_gpu_identity():
    from harness.measure.gpuinfo import gpu_identity

    ident = gpu_identity()
    assert ident.nvml_error is None, ident.nvml_error
    assert ident.uuid and ident.uuid.startswith("GPU-")
    assert ident.driver and ident.cuda_driver_version
    assert ident.sm_clock_max_mhz and ident.sm_clock_mhz and ident.sm_count and ident.l2_bytes
    assert ident.reference_sm_clock_mhz
    if "H200" in ident.name:
        assert ident.model_key == "nvidia-h200"
        assert ident.sm_count == 132


def test_measure_holds_the_stream_flushes_and_keeps_raw_samples():
    from harness.measure.timing import DeviceTimer, measure

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    c = torch.empty_like(a)
    t = measure(lambda i: torch.matmul(a, a, out=c), rule=quick())
    timer = DeviceTimer.get()
    assert "stream held by flag-spin kernel" in t.method, t.method
    assert f"L2 flush {timer.flush_bytes / 2**20:.0f} MiB" in t.method
    assert timer.flush_bytes == 2 * timer.l2_bytes
    assert len(t.samples_ms) >= 10 and t.median_ms > 0
    assert t.min_ms <= t.median_ms and t.iqr_ms >= 0
    assert t.rel_noise < 0.05
    # 2 * 4096^3 FLOP: between 50 and 1000 TFLOP/s on any recent datacenter GPU
    tflops = 2 * 4096**3 / (t.median_ms * 1e-3) / 1e12
    assert 50 < tflops < 1000


def test_launch_latency_is_kept_out_of_a_tiny_kernel():
    from harness.measure.timing import measure

    x = torch.zeros(1, device="cuda")
    t = measure(lambda i: x.add_(1), rule=quick())
    assert "stream held" in t.method
    assert t.median_ms < 0.015, t.median_ms  # a queued 1-element kernel: a few us


def test_a_launch_that_synchronises_turns_the_hold_off_instead_of_hanging():
    from harness.measure.timing import measure

    x = torch.zeros(1024, device="cuda")

    def blocking(i):
        x.add_(1)
        torch.cuda.synchronize()

    t = measure(blocking, rule=quick())
    assert "launch blocks the host" in t.method, t.method
    assert t.median_ms and t.median_ms > 0
    # For that measurement only: the next one on the device's shared timer holds again.
    t = measure(lambda i: x.add_(1), rule=quick())
    assert "stream held by flag-spin kernel" in t.method, t.method


def test_cold_is_not_faster_than_warm_for_l2_resident_inputs():
    from harness.measure.timing import measure

    x = torch.randn(4 << 20, device="cuda")  # 16 MiB: fits in L2
    out = torch.empty((), device="cuda")
    cold = measure(lambda i: torch.sum(x, dim=0, out=out), rule=quick())
    warm = measure(lambda i: torch.sum(x, dim=0, out=out), mode="warm", rule=quick())
    assert "no flush (warm)" in warm.method
    assert cold.median_ms >= warm.median_ms


def test_input_sets_rotate():
    from harness.measure.timing import measure

    seen = []
    x = torch.zeros(1, device="cuda")

    def launch(i):
        seen.append(i)
        x.add_(1)

    measure(launch, n_sets=3, rule=quick())
    assert set(seen) == {0, 1, 2}
    assert seen[-6:] in ([0, 1, 2] * 2, [1, 2, 0] * 2, [2, 0, 1] * 2)


def test_time_case_sdpa_flash_is_plausible():
    from harness.candidates.registry import get_candidate
    from harness.measure.perf import time_case

    case = Case.from_id("b4h16-4096x4096-d128-fp16-none")
    t = time_case(get_candidate("sdpa_flash"), case, rule=QUICK)
    assert t.median_ms and 0.5 < t.median_ms < 5.0  # 1.6-1.7 ms on an H200


def test_calibration_measures_and_round_trips(tmp_path):
    from harness.measure.calibrate import calibrate, read_calibration

    c = calibrate()
    assert c.copy_gbps > 100 and all(v > 10 for v in c.matmul_tflops_by_dtype.values())
    if "H200" in c.gpu.name:
        assert 2500 < c.copy_gbps < 5200  # 4.8 TB/s datasheet, ~4.2 measured
        assert 400 < c.matmul_tflops_by_dtype["float16"] < 989
    p = c.save(tmp_path / "cal.json")
    assert read_calibration(p).to_dict() == c.to_dict()


def test_calibrate_command_writes_json(tmp_path):
    out = tmp_path / "cal.json"
    proc = subprocess.run([sys.executable, "-m", "harness", "calibrate", "--json", "--out",
                           str(out)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["copy_gbps"] == json.loads(out.read_text())["copy_gbps"]


@pytest.mark.parametrize("name,case_id,expect", [
    ("sdpa_flash", "b2h4-113x203-d64-fp16-causal_br", Status.PASSED),
    ("sdpa_flash", "b2h8k2-128x217-d128-bf16-causal_br", Status.PASSED),
    ("sdpa_flash", "b2h4-256x512-d64-fp16-key_padding", Status.SKIPPED),
    ("sdpa_efficient", "b2h4-113x203-d64-fp16-causal_br", Status.PASSED),
    ("sdpa_math", "b2h4-203x113-d64-fp16-causal_br", Status.PASSED),
    ("sdpa_math", "b2h4-97x97-d64-fp16-random", Status.PASSED),
])
def test_peers_on_gpu(name, case_id, expect):
    from harness.candidates.registry import get_candidate
    from harness.core.check import check_case

    res = check_case(get_candidate(name), Case.from_id(case_id), device="cuda")
    assert res.status is expect, res.message


@dataclass
class IllegalAddress(Candidate):
    """Writes through a wild pointer when head_dim == 17, else zeros the output."""

    def run(self, case, inputs, out, lse):
        if case.head_dim != 17:
            out.zero_()
            return
        import cupy as cp

        k = cp.RawKernel(r'extern "C" __global__ void wild(float* p) { p[1ull << 40] = 1.f; }',
                         "wild")
        k((1,), (1,), (cp.uint64(out.data_ptr()),))
        torch.cuda.synchronize()


def make_illegal(name):
    return IllegalAddress(name=name, kind="cuda", device="cuda", isolate=True)


def zero_case_fn(candidate, case, options):
    from harness.core.cases import make_inputs
    from harness.core.results import CaseResult

    inputs = make_inputs(case, "cuda")
    out = torch.empty_like(inputs.q)
    candidate.run(case, inputs, out, None)
    torch.cuda.synchronize()
    return CaseResult(candidate.name, case, Status.PASSED, f"pid {os.getpid()}")


def test_cuda_illegal_address_is_crashed_and_the_rest_is_not_retried():
    """A lost CUDA context ends the candidate: its remaining cases are reported as not run
    instead of being re-tried one by one into the same failure."""
    from harness.execution.isolate import run_isolated

    cases = [Case(1, 1, 1, 8, 8, 16), Case(1, 1, 1, 8, 8, 17), Case(1, 1, 1, 8, 8, 16, seed=1)]
    res = run_isolated("illegal", cases, mode="check",
                       options={"factory": f"{__name__}:make_illegal",
                                "case_fn": f"{__name__}:zero_case_fn"}, timeout_s=60)
    assert [r.status for r in res] == [Status.PASSED, Status.CRASHED, Status.SKIPPED], \
        [r.message for r in res]
    assert "illegal" in res[1].message.lower()
    assert res[2].message == f"not run: {cases[1].id} lost its CUDA context"


def test_run_perf_times_peers_and_renders_the_table():
    from harness.candidates.registry import get_candidate
    from harness.measure.perf import run_perf
    from harness.measure.perf_table import format_table

    cases = [Case.from_id("b2h16-2048x2048-d128-fp16-none"),
             Case.from_id("b1h32k8-1x8192-d128-fp16-none")]
    cands = [get_candidate("sdpa_flash"), get_candidate("sdpa_efficient")]
    lines = []
    res = run_perf(cands, cases, timing={"rule": QUICK}, log=lines.append)
    assert len(res) == 4
    assert all(r.status is Status.PASSED for r in res), [r.message for r in res]
    assert all(r.tflops and r.timing.median_ms for r in res)
    flash = [r for r in res if r.kernel == "sdpa_flash"]
    assert all(r.extra["vs_baseline"] == pytest.approx(1.0) for r in flash)
    assert "kv_gbps" in res[2].extra
    text = format_table(res, "sdpa_flash", None)
    assert "sdpa_efficient" in text and "K+V GB/s" in text


def test_ncu_bytes_or_a_clear_reason():
    from harness.candidates.registry import get_candidate
    from harness.measure import ncu

    case = Case.from_id("b1h32-4096x4096-d128-fp16-none")
    m = ncu.measure_bytes(get_candidate("sdpa_flash"), case)
    if ncu.ncu_path() is None:
        assert "not found" in m.error
        return
    assert m.ok, m.error
    ideal = 4 * 32 * 4096 * 128 * 2
    assert 0.5 * ideal < m.read_bytes + m.write_bytes < 20 * ideal


def test_pytest_benchmark_front_agrees_with_measure(tmp_path):
    out = tmp_path / "agree.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "benchmark_agreement.py"),
                           "--cases", "b1h16-1024x1024-d64-fp16-none", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = json.loads(out.read_text())["rows"][0]
    assert abs(row["ratio"] - 1) <= 0.03
