"""Nsight Compute bytes: CSV parsing (thousands separators, units, several kernels) and
the ways ncu can be absent or refuse, through a fake `ncu` executable."""

from __future__ import annotations

import os
import stat
import textwrap

import pytest

from harness.core.candidate import Candidate, Support
from harness.core.cases import Case
from harness.measure import ncu

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')


def row(kid, kernel, metric, unit, value):
    return (f'"{kid}","4242","python3.12","127.0.0.1","{kernel}","1","7","(128, 1, 1)",'
            f'"(32, 16, 1)","0","9.0","Command line profiler metrics","{metric}","{unit}",'
            f'"{value}"')


SAMPLE = "\n".join([
    "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
    "some line the program printed",
    HEADER,
    row(0, "fa2_fwd_fp16_d128", "dram__bytes_read.sum", "byte", "67,108,864"),
    row(0, "fa2_fwd_fp16_d128", "dram__bytes_write.sum", "byte", "33,554,432"),
    row(0, "fa2_fwd_fp16_d128", "gpu__time_duration.sum", "nsecond", "1,234,567"),
    row(1, "fa2_combine", "dram__bytes_read.sum", "Kbyte", "1.5"),
    row(1, "fa2_combine", "dram__bytes_write.sum", "Mbyte", "2"),
    row(1, "fa2_combine", "gpu__time_duration.sum", "usecond", "3.5"),
    "==PROF== Disconnected from process 4242",
])


def test_parse_sums_kernels_and_handles_separators_and_units():
    r = ncu.parse_csv(SAMPLE)
    assert r.ok, r.error
    assert r.read_bytes == 67_108_864 + 1_500
    assert r.write_bytes == 33_554_432 + 2_000_000
    assert r.time_ns == pytest.approx(1_234_567 + 3_500)
    assert r.kernels == ["fa2_fwd_fp16_d128", "fa2_combine"]


def test_parse_number():
    assert ncu.parse_number("1,234,567") == 1234567
    assert ncu.parse_number(" 12.5 ") == 12.5
    assert ncu.parse_number("n/a") is None
    assert ncu.parse_number("") is None


def test_parse_without_rows_or_metrics_is_an_error_not_a_zero():
    assert not ncu.parse_csv("==PROF== nothing\n").ok
    only_time = "\n".join([HEADER, row(0, "k", "gpu__time_duration.sum", "nsecond", "5")])
    r = ncu.parse_csv(only_time)
    assert not r.ok and "dram__bytes_read" in r.error
    assert "ERR_NVGPUCTRPERM" in ncu.parse_csv("==ERROR== ERR_NVGPUCTRPERM - no").error


def test_unknown_unit_is_refused():
    bad = "\n".join([HEADER, row(0, "k", "dram__bytes_read.sum", "furlong", "5")])
    with pytest.raises(ValueError, match="furlong"):
        ncu.parse_csv(bad)


def _cand(kind="cuda", entries=("fa2_fwd_fp16_d128", "fa2_combine")):
    class C(Candidate):
        def run(self, case, inputs, out, lse):
            raise AssertionError("not run here")

    return C(name="fa2_test", kind=kind, device="cuda", support=Support(),
             meta={"entries": list(entries)})


CASE = Case(1, 1, 1, 4096, 4096, 128)


def test_command_line():
    cmd = ncu.command("fa2_test", CASE.id, entries=["a_b", "c"], ncu="/x/ncu")
    assert cmd[0] == "/x/ncu"
    joined = " ".join(cmd)
    for part in ("--cache-control all", "--clock-control none", "--csv",
                 "--profile-from-start off", "--print-units base",
                 "dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum",
                 "-k regex:^(a_b|c)$", "-m harness.measure.ncu_target --kernel fa2_test",
                 f"--case {CASE.id}"):
        assert part in joined
    assert "-k" not in ncu.command("sdpa_flash", CASE.id)


def test_missing_ncu_is_one_line(monkeypatch):
    monkeypatch.delenv("FA_HARNESS_NCU", raising=False)
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    r = ncu.measure_bytes(_cand(), CASE)
    assert not r.ok and "not found" in r.error and "\n" not in r.error


def _fake_ncu(tmp_path, monkeypatch, script: str):
    exe = tmp_path / "ncu"
    exe.write_text("#!/bin/sh\n" + textwrap.dedent(script))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FA_HARNESS_NCU", str(exe))
    return exe


def test_fake_ncu_output_is_parsed(tmp_path, monkeypatch):
    data = tmp_path / "out.csv"
    data.write_text(SAMPLE + "\n")
    _fake_ncu(tmp_path, monkeypatch, f'echo "$@" > {tmp_path}/args\ncat {data}\n')
    r = ncu.measure_bytes(_cand(), CASE)
    assert r.ok, r.error
    assert r.read_bytes == 67_108_864 + 1_500
    args = (tmp_path / "args").read_text()
    assert "regex:^(fa2_fwd_fp16_d128|fa2_combine)$" in args


@pytest.mark.parametrize("text,expect", [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", "ERR_NVGPUCTRPERM"),
    ("==ERROR== Failed to prepare kernel for profiling: LibraryNotLoaded", "LibraryNotLoaded"),
])
def test_fake_ncu_refusals(tmp_path, monkeypatch, text, expect):
    _fake_ncu(tmp_path, monkeypatch, f"echo '{text}' >&2\nexit 1\n")
    r = ncu.measure_bytes(_cand(), CASE)
    assert not r.ok and expect in r.error and "\n" not in r.error


def test_peer_is_not_filtered_by_kernel_name(tmp_path, monkeypatch):
    _fake_ncu(tmp_path, monkeypatch, f'echo "$@" > {tmp_path}/args\nexit 0\n')
    r = ncu.measure_bytes(_cand(kind="peer"), CASE)
    assert not r.ok  # no CSV: an error, not zero bytes
    assert " -k " not in (tmp_path / "args").read_text()
    assert os.environ["FA_HARNESS_NCU"].endswith("ncu")
