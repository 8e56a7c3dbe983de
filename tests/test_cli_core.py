"""`fa-harness run`, `iomodel` and `kernels`: outputs and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fake_candidates import make_fake

from harness.candidates import registry
from harness.cli import main
from harness.core.cases import Case, MaskKind
from harness.core.grids import GRIDS

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


@pytest.fixture
def fakes(monkeypatch):
    """Replace discovery with in-test candidates (one correct, one wrong)."""
    pool = {"default": [make_fake(), make_fake("perturb")], "planted": [make_fake("nan")]}

    def discover(kinds=registry.DEFAULT_KINDS):
        return list(pool["planted" if tuple(kinds) == ("planted",) else "default"])

    monkeypatch.setattr(registry, "discover", discover)
    monkeypatch.setattr(registry, "load_errors", lambda: [])
    monkeypatch.setattr(registry, "notes", lambda: [])
    # A three-case smoke grid keeps these CLI tests fast; the real grid is tested elsewhere.
    monkeypatch.setitem(GRIDS, "smoke", lambda: [
        Case(2, 4, 2, 37, 29, 32, "float16", MaskKind.CAUSAL_BR),
        Case(1, 2, 2, 5, 9, 16, "bfloat16", MaskKind.RANDOM),
        Case(3, 2, 1, 16, 16, 64, "float16", MaskKind.KEY_PADDING)])
    return pool


def test_iomodel_json_contract(capsys):
    code = main(["iomodel", "--seq-len", "4096", "--head-dim", "64", "--block-q", "64",
                 "--dtype", "float16", "--gpu", "h100-sxm", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)  # exactly one JSON object
    assert out["flops"] == 4 * 4096 * 4096 * 64
    for algo, (mib, ai, tf) in {"naive_3pass": (194, 21, 71), "naive_fused": (130, 32, 106),
                                "fa2": (65, 63, 211)}.items():
        r = out[algo]
        assert round(r["hbm_bytes"] / 2**20) == mib
        assert round(r["arithmetic_intensity"]) == ai
        assert round(r["roofline_tflops"]) == tf


def test_iomodel_table_and_options(capsys):
    assert main(["iomodel", "--batch", "2", "--heads", "8", "--kv-heads", "2", "--seq-len",
                 "1024", "--seq-len-k", "2048", "--block-k", "128", "--causal"]) == 0
    out = capsys.readouterr().out
    assert "naive_3pass" in out and "fa2" in out and "roofline" in out


@pytest.mark.parametrize("argv", [["iomodel", "--gpu", "tpu"], ["iomodel", "--head-dim", "0"],
                                  ["iomodel", "--dtype", "float32"]])
def test_iomodel_bad_input_is_one_line_exit_2(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err


def test_unparsable_argument_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["iomodel", "--seq-len", "x"])
    assert exc.value.code == 2 and capsys.readouterr().err.count("\n") == 1


@no_gpu
def test_run_passes_fails_and_writes_json(fakes, capsys, tmp_path):
    path = tmp_path / "out.json"
    assert main(["run", "--kernels", "fake_none", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("no CUDA device here") == 1 and "fake_none" in out
    data = json.loads(path.read_text())
    assert data["grid"] == "smoke" and all(r["status"] == "passed" for r in data["results"])
    assert main(["run"]) == 1  # default: every available candidate, one of them wrong
    out = capsys.readouterr().out
    assert "FAILED fake_perturb" in out and "out: max error" in out
    assert main(["run", "--kernels", "fake_nan"]) == 1  # planted bugs when named


@no_gpu
def test_run_records_and_stores(fakes, capsys, tmp_path, monkeypatch):
    pytest.importorskip("harness.records.record")
    pytest.importorskip("harness.records.db.store")
    monkeypatch.setenv("FA_HARNESS_HOME", str(tmp_path / "home"))
    rec, db = tmp_path / "run.json", tmp_path / "results.sqlite"
    assert main(["run", "--kernels", "fake_none", "--record", str(rec), "--db",
                 f"sqlite:///{db}"]) == 0
    out = capsys.readouterr().out
    assert "record written" in out and "stored as run 1" in out
    data = json.loads(rec.read_text())
    assert len(data["results"]) == 3 and data["grids"] == ["smoke"]
    # Every settled case also went to the partial file as it landed (what a job killed by
    # its time limit leaves behind): the same cases as the record.
    partial = [json.loads(x) for x in Path(f"{rec}.partial.jsonl").read_text().splitlines()]
    assert sorted(r["case_id"] for r in partial) == \
        sorted(r["case_id"] for r in data["results"])
    assert list((tmp_path / "home" / "spool").glob("*.json")) == []
    # An unreachable database: exit 2, one line, and the record waits in the spool.
    assert main(["run", "--kernels", "fake_none", "--db",
                 "postgresql+psycopg://nobody@127.0.0.1:1/none"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "record kept in" in err
    assert len(list((tmp_path / "home" / "spool").glob("*.json"))) == 1


@no_gpu
def test_run_usage_errors_exit_2(fakes, capsys):
    assert main(["run", "--grid", "huge"]) == 2
    assert "unknown grid 'huge'" in capsys.readouterr().err
    assert main(["run", "--kernels", "fa9*"]) == 2
    assert "no candidate matches 'fa9*'" in capsys.readouterr().err
    assert main(["run", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert main(["run", "--repeats", "0"]) == 2


@no_gpu
def test_run_timing_grid_on_cpu_says_so_in_one_line(fakes, capsys):
    assert main(["run", "--grid", "perf"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "timing needs a GPU" in out


def test_kernels_lists_and_flags_load_errors(fakes, capsys, monkeypatch):
    assert main(["kernels"]) == 0
    out = capsys.readouterr().out
    assert "fake_none" in out and "fake_perturb" in out
    assert main(["kernels", "--json", "--planted"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = [c["name"] for c in data["candidates"]]
    assert names == ["fake_none", "fake_perturb", "fake_nan"]
    assert data["candidates"][0]["available"] == "yes"
    assert data["candidates"][0]["extras"] == "none"  # declares no modifier, d_v or fp8
    monkeypatch.setattr(registry, "load_errors", lambda: ["kernels/x/manifest.toml: bad"])
    assert main(["kernels"]) == 1
    assert "variant load error" in capsys.readouterr().out
    assert main(["kernels", "--arch", "90"]) == 2


def test_console_script_runs():
    proc = subprocess.run([sys.executable, "-m", "harness", "iomodel", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fa2"]["hbm_bytes"] > 0
    proc = subprocess.run([sys.executable, "-m", "harness", "run", "--bogus"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


def _pytest_suites(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "harness/suites/test_correctness.py",
                           "-p", "no:cacheprovider", "-q", *args],
                          capture_output=True, text=True, timeout=300)


def test_suite_parametrization_ids_and_options():
    proc = _pytest_suites("--collect-only", "--fa-kernels", "sdpa_math", "--fa-grid", "smoke")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = [line for line in proc.stdout.splitlines() if "::test_correctness[" in line]
    assert len(ids) == 25
    assert any(i.endswith("[sdpa_math-b2h4-113x203-d64-fp16-causal_br]") for i in ids)
    bad = _pytest_suites("--collect-only", "--fa-kernels", "nope*")
    assert bad.returncode == 4 and "no candidate matches 'nope*'" in bad.stderr
    bad = _pytest_suites("--collect-only", "--fa-grid", "huge")
    assert bad.returncode == 4 and "unknown grid 'huge'" in bad.stderr
    bad = _pytest_suites("--collect-only", "--fa-repeats", "0")
    assert bad.returncode == 4 and "--fa-repeats must be >= 1" in bad.stderr


def test_suite_runs_a_candidate_end_to_end():
    proc = _pytest_suites("--fa-kernels", "sdpa_math", "--fa-grid", "smoke", "-k",
                          "causal_br or random")
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert " passed" in proc.stdout.splitlines()[-1]
