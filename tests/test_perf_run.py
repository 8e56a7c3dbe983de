"""The perf run's arithmetic and table, the calibration file, `fa-harness calibrate`
without a GPU, and the GPU identity's graceful degradation, all on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from harness.core.cases import Case, MaskKind
from harness.core.results import CaseResult, Status, Timing
from harness.measure import perf, perf_table
from harness.measure.calibrate import (
    Calibration,
    CalibrationError,
    default_path,
    load_calibration,
    read_calibration,
)
from harness.measure.gpuinfo import GpuIdentity, gpu_identity, gpu_model_key

NO_GPU = not torch.cuda.is_available()


def cal() -> Calibration:
    gpu = GpuIdentity(name="NVIDIA H200", uuid="GPU-1234", driver="580.159.04",
                      cuda_driver_version="13.0", sm_clock_mhz=1980, sm_clock_max_mhz=1980)
    return Calibration(gpu=gpu, copy_gbps=4240.0,
                       matmul_tflops_by_dtype={"float16": 672.1, "bfloat16": 660.0},
                       created="2026-11-29T12:00:00")


# ---------------------------------------------------------------- calibration file


def test_calibration_round_trip(tmp_path):
    c = cal()
    path = c.save(tmp_path / "sub" / "cal.json")
    back = read_calibration(path)
    assert back.to_dict() == c.to_dict()
    assert back.gpu.model_key == "nvidia-h200"
    data = json.loads(path.read_text())
    # what harness.core.iomodel.Ceilings.from_dict reads
    from harness.core.iomodel import Ceilings

    ceil = Ceilings.from_dict(data)
    assert (ceil.copy_gbps, ceil.matmul_tflops) == (4240.0, 672.1)
    assert c.ceilings("bfloat16").matmul_tflops == 660.0
    assert not list(path.parent.glob("*.tmp*"))  # atomic write leaves nothing behind


def test_load_calibration_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("FA_HARNESS_CALIBRATION", raising=False)
    assert default_path("GPU-1234") == tmp_path / ".cache/fa-harness/calibration-GPU-1234.json"
    assert load_calibration(uuid="GPU-1234") is None  # none yet: not an error
    cal().save(default_path("GPU-1234"))
    assert load_calibration(uuid="GPU-1234").copy_gbps == 4240.0
    other = cal()
    other.copy_gbps = 1.0
    other.save(tmp_path / "x.json")
    monkeypatch.setenv("FA_HARNESS_CALIBRATION", str(tmp_path / "x.json"))
    assert load_calibration().copy_gbps == 1.0
    monkeypatch.setenv("FA_HARNESS_CALIBRATION", str(tmp_path / "missing.json"))
    with pytest.raises(CalibrationError, match="no calibration file"):
        load_calibration()


@pytest.mark.parametrize("text,match", [
    ("{", "not valid JSON"),
    ("[]", "JSON object"),
    ('{"gpu": {}, "copy_gbps": 1}', "missing matmul_tflops_by_dtype"),
    ('{"gpu": {}, "copy_gbps": "fast", "matmul_tflops_by_dtype": {"float16": 1}}', "non-numeric"),
    ('{"gpu": {}, "copy_gbps": -1, "matmul_tflops_by_dtype": {"float16": 1}}', "positive"),
    ('{"version": 99, "gpu": {}, "copy_gbps": 1, "matmul_tflops_by_dtype": {"a": 1}}', "newer"),
])
def test_bad_calibration_files_say_what_is_wrong(tmp_path, text, match):
    p = tmp_path / "c.json"
    p.write_text(text)
    with pytest.raises(CalibrationError, match=match) as e:
        read_calibration(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU path")
def test_calibrate_command_without_gpu_exits_2(capsys):
    from harness.cli import main

    assert main(["calibrate", "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no CUDA GPU" in err


# ---------------------------------------------------------------- GPU identity


def test_gpu_model_key():
    assert gpu_model_key("NVIDIA H200") == "nvidia-h200"
    assert gpu_model_key("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert gpu_model_key("") == "unknown"


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU path")
def test_gpu_identity_without_gpu_is_partial_not_a_crash():
    ident = gpu_identity()
    assert ident.nvml_error and "\n" not in ident.nvml_error
    assert ident.torch_version == torch.__version__
    assert GpuIdentity.from_dict(ident.to_dict()) == ident


# ---------------------------------------------------------------- derived numbers, table


def timed(kernel: str, case: Case, ms: float, flops: int, model: int, ideal: int) -> CaseResult:
    return CaseResult(kernel, case, Status.PASSED,
                      timing=Timing(samples_ms=[ms] * 3, median_ms=ms, min_ms=ms, iqr_ms=0.0,
                                    rel_noise=0.001),
                      flops=flops, bytes_model=model, bytes_ideal=ideal)


CASE = Case(4, 16, 16, 4096, 4096, 128)
DECODE = Case(1, 32, 8, 1, 65536, 128)


def test_annotate_tflops_roofline_and_decode_bandwidth():
    from harness.core.flops import attention_flops
    from harness.core.iomodel import ideal_bytes

    flops = attention_flops(CASE)
    assert flops == 4 * 4 * 16 * 4096 * 4096 * 128
    r = timed("x", CASE, 2.0, flops, 3 * ideal_bytes(CASE), ideal_bytes(CASE))
    perf.annotate(r, cal())
    assert r.tflops == pytest.approx(flops / 2e-3 / 1e12)
    # compute-bound at this intensity: the roofline is the measured fp16 matmul rate
    assert r.extra["roofline_tflops"] == pytest.approx(672.1)
    assert r.extra["roofline_pct"] == pytest.approx(100 * r.tflops / 672.1)
    assert r.extra["ceilings"] == "measured"
    assert "kv_gbps" not in r.extra

    d = timed("y", DECODE, 0.01, attention_flops(DECODE), 0, ideal_bytes(DECODE))
    perf.annotate(d, cal())
    kv = 2 * 1 * 8 * 65536 * 128 * 2
    assert d.extra["kv_gbps"] == pytest.approx(kv / 1e-5 / 1e9)
    # bandwidth-bound: roofline = intensity x copy bandwidth
    ai = d.flops / d.bytes_ideal
    assert d.extra["roofline_tflops"] == pytest.approx(ai * 4240.0 / 1000)


def test_annotate_without_calibration_uses_datasheet_of_known_gpu_only():
    r = timed("x", CASE, 2.0, 10**12, 10**9, 10**9)
    perf.annotate(r, None, "nvidia-h200")
    assert r.extra["ceilings"] == "datasheet"
    r2 = timed("x", CASE, 2.0, 10**12, 10**9, 10**9)
    perf.annotate(r2, None, "some-other-gpu")
    assert "roofline_pct" not in r2.extra and r2.extra["ceilings"] == "no calibration"


def test_baseline_ratio_and_table():
    causal = Case(4, 16, 16, 4096, 4096, 128, mask=MaskKind.CAUSAL_BR)
    rows = [timed("sdpa_flash", CASE, 2.0, 10**12, 10**9, 10**9),
            timed("fa2_mma", CASE, 1.0, 10**12, 2 * 10**9, 10**9),
            CaseResult("fa2_mma", causal, Status.CRASHED,
                       "child process killed by SIGSEGV; stderr tail:\nboom"),
            timed("sdpa_flash", DECODE, 0.02, 10**9, 10**8, 10**8)]
    rows[1].bytes_measured_read, rows[1].bytes_measured_write = 3 << 20, 1 << 20
    for r in rows:
        perf.annotate(r, cal())
    perf.add_baseline_ratios(rows, "sdpa_flash")
    assert rows[1].extra["vs_baseline"] == pytest.approx(2.0)
    assert rows[0].extra["vs_baseline"] == pytest.approx(1.0)
    assert "vs_baseline" not in rows[2].extra
    text = perf_table.format_table(rows, "sdpa_flash", cal())
    for needle in ("median ms", "TFLOP/s", "x sdpa_flash", "model MiB", "ideal MiB", "crashed:",
                   "ncu rd+wr MiB", "K+V GB/s", "% roofline", "2.00",
                   "1.0000", "4.0", "measured ceilings", "SIGSEGV"):
        assert needle in text, needle


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU path")
def test_run_perf_without_gpu_says_so():
    with pytest.raises(perf.PerfUnavailable, match="CUDA GPU"):
        perf.run_perf([], [CASE])


def test_make_launch_prefers_timed_call():
    from harness.candidates.peers import SdpaPeer
    from harness.core.cases import make_inputs

    p = SdpaPeer(name="sdpa_math", kind="peer", device="cpu", backend="math")
    case = Case(1, 2, 2, 8, 8, 16)
    out = torch.zeros(1, 2, 8, 16, dtype=torch.float16)
    launch = perf.make_launch(p, case, [make_inputs(case), make_inputs(case, draw=1)], out, None)
    a, b = launch(0), launch(1)
    assert not torch.equal(a, b)  # two input sets really rotate
    assert torch.all(out == 0)  # the timed call does not copy into out


def test_placed_sets_give_each_set_its_own_outputs_and_place():
    from harness.candidates.registry import get_candidate

    cand = get_candidate("template")
    case = Case(1, 2, 2, 8, 8, 16)
    sets, outputs, spacers = perf.placed_sets(cand, case, 3, seed=1, device="cpu")
    assert len(sets) == len(outputs) == 3 and len(spacers) == 6
    assert len({o.data_ptr() for o, _ in outputs}) == 3
    assert len({s.numel() for s in spacers}) == 6   # sizes drawn, not one stride
    small, large = spacers[0].numel(), spacers[1].numel()
    assert small <= 512 * 1024 < 1 << 20 <= large < 3 << 20
    again = perf.placed_sets(cand, case, 3, seed=1, device="cpu")[2]
    assert [s.numel() for s in again] == [s.numel() for s in spacers]   # seeded


def test_make_launch_writes_each_sets_own_outputs():
    from harness.core.cases import make_inputs

    calls = []

    class Cand:
        def run(self, case, inputs, out, lse):
            calls.append((inputs, out, lse))

    case = Case(1, 2, 2, 8, 8, 16)
    sets = [make_inputs(case), make_inputs(case, draw=1)]
    outs = [(torch.empty(1), None), (torch.empty(2), None)]
    launch = perf.make_launch(Cand(), case, sets, None, None, outputs=outs)
    launch(1)
    launch(0)
    assert calls[0][0] is sets[1] and calls[0][1] is outs[1][0]
    assert calls[1][0] is sets[0] and calls[1][1] is outs[0][0]
    with pytest.raises(ValueError, match="1 output buffers for 2 input sets"):
        perf.make_launch(Cand(), case, sets, None, None, outputs=outs[:1])
