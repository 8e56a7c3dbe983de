"""Python candidates (harness.candidates.python_candidate): the protocol's checks, the
isolated child, the shipped flex_attention and Triton FA2, and bad candidates that must
become their own verdict without touching the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.candidates import discovery, registry
from harness.core.cases import Case, MaskKind
from harness.core.check import check_case
from harness.core.grids import get_grid
from harness.core.results import Status

TESTS = Path(__file__).parent
CASE = Case(1, 2, 2, 37, 53, 64, "float16", MaskKind.NONE)


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.delenv(discovery.ENV_CONFIG, raising=False)
    monkeypatch.setattr(discovery, "_config", discovery.Config())
    registry.clear_cache()
    yield
    registry.clear_cache()


def _python(name: str):
    return next(c for c in registry.discover(("python",)) if c.name == name)


def test_shipped_candidates_are_registered_by_entry_point():
    names = {c.name: registry.origin(c) for c in registry.discover(("python",))}
    assert names["flex_attention"].startswith("entry point flex_attention")
    assert names["triton_fa2"].startswith("entry point triton_fa2")


@pytest.mark.parametrize("mask", list(MaskKind))
def test_flex_attention_on_the_cpu_every_mask_kind(mask, one_torch_thread):
    flex = _python("flex_attention")
    if torch.cuda.is_available():
        pytest.skip("covered on the GPU by test_shipped_python_candidates_gpu")
    case = Case(2, 4, 2, 41, 67, 64, "bfloat16", mask)
    res = check_case(flex, case, device="cpu")
    assert res.status is Status.PASSED, res.message


def test_triton_reports_itself_unavailable_in_one_line(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reason = registry.unavailable_reason(_python("triton_fa2"))
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert reason and "\n" not in reason
    assert reason.startswith(("needs Triton", "needs a CUDA GPU"))


def _in_the_interpreter(code: str) -> dict:
    """Run `code` in a fresh process under Triton's CPU interpreter (Triton reads
    TRITON_INTERPRET when it is imported); its last stdout line is JSON."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_triton_kernel_in_the_interpreter():
    """The Triton kernel itself, run by Triton's CPU interpreter (when Triton is installed:
    it is not a CI dependency): GQA, causal bottom-right, random mask, odd head dim."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the GPU test runs the compiled kernel")
    # Triton reads TRITON_INTERPRET when it is imported: a fresh process.
    code = """
import json
from harness.candidates import registry
from harness.core.cases import Case, MaskKind
from harness.core.check import check_case
tri = next(c for c in registry.discover(("python",)) if c.name == "triton_fa2")
assert registry.unavailable_reason(tri) is None and tri.device == "cpu"
out = {}
for case in (Case(1, 4, 2, 45, 70, 59, "float16", MaskKind.CAUSAL_BR),
             Case(2, 2, 2, 33, 40, 64, "bfloat16", MaskKind.RANDOM),
             Case(3, 2, 1, 20, 50, 32, "float16", MaskKind.KEY_PADDING)):
    res = check_case(tri, case, device="cpu")
    out[case.id] = [res.status.value, res.message]
print(json.dumps(out))
"""
    got = _in_the_interpreter(code)
    assert len(got) == 3 and all(v[0] == "passed" for v in got.values()), got


def test_protocol_errors_are_error_verdicts_naming_the_problem():
    discovery.configure([], ["bad_candidates:wrong_shape", "bad_candidates:wrong_dtype",
                             "bad_candidates:missing_lse", "bad_candidates:raises"])
    got = {c.name: check_case(c, CASE, device="cpu") for c in registry.discover(("python",))
           if c.name.startswith("bad_")}
    assert {n: r.status for n, r in got.items()} == dict.fromkeys(
        ("bad_shape", "bad_dtype", "bad_no_lse", "bad_raises"), Status.ERROR)
    assert "out has shape (1, 2, 36, 64), expected (1, 2, 37, 64)" in got["bad_shape"].message
    assert "dtype torch.float32, expected torch.float16" in got["bad_dtype"].message
    assert "expected (out, lse)" in got["bad_no_lse"].message
    assert "out of registers" in got["bad_raises"].message


def test_invalid_declaration_is_one_line(capsys):
    from harness.cli import main

    assert main(["kernels", "--candidate", "bad_candidates:invalid"]) == 2
    err = capsys.readouterr().err
    assert "name 'bad decl'" in err and "device 'tpu'" in err and err.count("\n") == 1


def test_bad_candidates_through_the_cli_leave_the_others_alone(tmp_path):
    """`fa-harness run` with a crashing, a raising, a wrong-shape and a good candidate:
    each bad one gets its verdict, the good one passes, exit 1, no traceback."""
    out = tmp_path / "results.json"
    cmd = [sys.executable, "-m", "harness", "run", "--cases", "b2h4-113x203-d64-fp16-none",
           "--no-progress", "--json", str(out), "--kernels", "good_sdpa,bad_*"]
    for attr in ("good", "raises", "wrong_shape", "crashes"):
        cmd += ["--candidate", f"bad_candidates:{attr}"]
    env = {**os.environ, "FA_HARNESS_HOME": str(tmp_path)}
    proc = subprocess.run(cmd, cwd=TESTS, capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    rows = rows["results"] if isinstance(rows, dict) else rows
    status = {}
    for r in rows:
        status.setdefault(r["kernel"], set()).add(r["status"])
    assert status["good_sdpa"] <= {"passed", "skipped"} and "passed" in status["good_sdpa"]
    assert status["bad_raises"] - {"skipped"} == {"error"}
    assert status["bad_shape"] - {"skipped"} == {"error"}
    assert status["bad_crash"] - {"skipped"} == {"crashed"}


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["flex_attention", "triton_fa2"])
def test_shipped_python_candidates_gpu(name):
    """On a GPU: the compiled flex_attention and the Triton kernel pass the smoke grid in
    isolated children, every mask kind and both dtypes, one child per mask kind side by
    side as the CI gate runs them (harness.runs.gate_prepare.split_python)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from harness.execution.runner import run_correctness
    from harness.runs.gate_prepare import split_python

    cand = _python(name)
    reason = registry.unavailable_reason(cand)
    if reason:
        pytest.skip(f"{name}: {reason}")
    results = run_correctness([cand], get_grid("smoke"), parallel=5, split=split_python)
    bad = [f"{r.case.id}: {r.status.value}: {r.message}" for r in results
           if r.status not in (Status.PASSED, Status.SKIPPED)]
    assert not bad, "\n".join(bad)
    assert {r.case.mask for r in results if r.status is Status.PASSED} == set(MaskKind)


def test_prepare_is_outside_the_timed_call():
    """With `prepare`, the timed call is what prepare returned: the preparation runs once
    per input set, not once per timed call."""
    from harness.candidates.python_candidate import PythonKernel, to_candidate
    from harness.core.cases import make_inputs

    calls = {"prepare": 0, "call": 0}

    def fn(q, k, v, **kw):
        raise AssertionError("fn is not called when prepare is given")

    def prepare(q, k, v, **kw):
        calls["prepare"] += 1

        def call():
            calls["call"] += 1
            return torch.nn.functional.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), scale=kw["scale"]).to(q.dtype)
        return call

    cand = to_candidate(PythonKernel(name="prepared", fn=fn, device="cpu", masks=("none",),
                                     prepare=prepare), "test")
    timed = cand.timed_call(CASE, make_inputs(CASE), None, None)
    for _ in range(3):
        timed()
    assert calls == {"prepare": 1, "call": 3}
    assert check_case(cand, CASE, device="cpu").status is Status.PASSED


def test_pyproject_candidates_are_found(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.fa-harness]\ncandidates = ["bad_candidates:good"]\n')
    monkeypatch.chdir(tmp_path)
    origins = {c.name: registry.origin(c) for c in registry.discover(("python",))}
    assert origins["good_sdpa"] == \
        f"pyproject.toml ({tmp_path / 'pyproject.toml'}) bad_candidates:good"


def test_flex_falls_back_on_a_compile_failure_only_and_remembers_the_path():
    from harness.candidates import flex

    class NoValidChoicesError(RuntimeError):
        pass

    NoValidChoicesError.__module__ = "torch._inductor.select_algorithm"
    calls = []

    def attempt(fn, opts):
        calls.append((fn, opts))
        if fn == "compiled" and opts is None:
            raise NoValidChoicesError("No choices to select")
        return f"{fn}-{opts}"

    paths = [("compiled", None), ("compiled", "small"), ("eager", None)]
    notes = []
    key = ("test-shape", id(calls))
    assert flex.first_working(key, paths, attempt, lambda e, nxt: notes.append(nxt)) == \
        "compiled-small"
    assert notes == [("compiled", "small")]
    calls.clear()
    assert flex.first_working(key, paths, attempt, notes.append) == "compiled-small"
    assert calls == [("compiled", "small")]  # no retry of the failing path

    def cuda_fault(fn, opts):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        flex.first_working(("other", id(notes)), paths, cuda_fault, notes.append)



def test_a_candidates_notes_are_kept_with_its_result():
    """flex_attention's fallback note (and any candidate's `notes`) lands in the case's
    result, so a record says which path produced the number; notes are drained per case,
    and a broken notes() is itself a note."""
    from harness.candidates import flex
    from harness.candidates.python_candidate import PythonKernel, to_candidate

    def attention(q, k, v, **kw):
        flex._note_fallback(RuntimeError("No choices"), ("e", None))
        return torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float()).to(q.dtype)

    def declared(notes):
        return to_candidate(PythonKernel(name="noted", fn=attention, device="cpu",
                                         dtypes=("float16",), masks=("none",), gqa=False,
                                         notes=notes), "test")

    cand = declared(flex.take_notes)
    want = ["compiled kernel failed (RuntimeError: No choices); ran torch's eager "
            "flex_attention"]
    for _ in range(2):  # the second case has its own note, not the first one's as well
        res = check_case(cand, CASE, device="cpu")
        assert res.status is Status.PASSED, res.message
        assert res.extra["notes"] == want

    def broken():
        raise KeyError("x")

    res = check_case(declared(broken), CASE, device="cpu")
    assert res.status is Status.PASSED and res.extra["notes"] == ["notes() raised KeyError: 'x'"]
    flex.take_notes()


@pytest.mark.slow
def test_triton_backward_in_the_interpreter():
    """triton_fa2's backward (harness.candidates.triton_fa2_bwd) in Triton's CPU
    interpreter (when Triton is installed): GQA with odd head dim under causal
    bottom-right, fully masked rows (Nq > Nk), a random mask in bf16, key padding with
    MQA, top-left causal; two repeats bitwise equal (it declares itself deterministic)."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the GPU runs the compiled kernel (bench/h200_backward.sh)")
    code = """
import json
from harness.candidates import registry
from harness.core.cases import Case, MaskKind
from harness.core.check_grad import check_backward_case
tri = next(c for c in registry.discover(("python",)) if c.name == "triton_fa2")
assert tri.support.backward and tri.support.backward_deterministic
out = {}
for case in (Case(1, 4, 2, 45, 70, 59, "float16", MaskKind.CAUSAL_BR),
             Case(1, 2, 2, 70, 45, 64, "float16", MaskKind.CAUSAL_BR),
             Case(2, 2, 2, 33, 40, 64, "bfloat16", MaskKind.RANDOM),
             Case(3, 2, 1, 20, 50, 32, "float16", MaskKind.KEY_PADDING),
             Case(1, 2, 2, 37, 29, 64, "bfloat16", MaskKind.CAUSAL_TL)):
    res = check_backward_case(tri, case, device="cpu", repeats=2)
    out[case.id] = [res.status.value, res.message, res.extra.get("determinism")]
print(json.dumps(out))
"""
    got = _in_the_interpreter(code)
    assert len(got) == 5 and all(v[0] == "passed" for v in got.values()), got
    assert all(v[2] == "2 runs bitwise equal" for v in got.values()), got
