"""check_case (the whole protocol on one case) and the runner over candidates x cases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fake_candidates import isolated

from harness.core.candidate import Support
from harness.core.cases import Case, MaskKind
from harness.core.check import check_case
from harness.core.results import Status
from harness.execution.runner import exit_code, run_correctness, summarize

# Nq > Nk bottom-right: fully masked rows; GQA; partial tiles.
CASE = Case(2, 4, 2, 37, 29, 32, "float16", MaskKind.CAUSAL_BR)


def test_a_correct_candidate_passes_and_is_annotated(fake):
    res = check_case(fake(), CASE, device="cpu")
    assert res.status is Status.PASSED, res.message
    assert res.errors.ratio is not None and res.errors.ratio <= 2
    assert res.flops == 4 * 32 * 8 * sum(max(0, min(29, i - 8 + 1)) for i in range(37))
    assert res.bytes_ideal and res.bytes_model and res.bytes_model > res.bytes_ideal


@pytest.mark.parametrize("bug,status,fragment", [
    ("perturb", Status.FAILED, "out: max error"),
    ("nan", Status.FAILED, "non-finite"),
    ("skip_row", Status.FAILED, "never written"),
    ("skip_lse_row", Status.FAILED, "lse: "),
    ("masked_nonzero", Status.FAILED, "fully masked row not exactly 0"),
    ("lse_off", Status.FAILED, "lse: max error"),
    ("lse_plus_inf", Status.FAILED, "must be -inf"),
    ("modify_input", Status.FAILED, "input k was modified"),
    ("write_after", Status.FAILED, "after the output"),
    ("write_before", Status.FAILED, "before the output"),
    ("raise", Status.ERROR, "RuntimeError: kernel launch failed"),
])
def test_each_planted_fault_is_caught(fake, bug, status, fragment):
    res = check_case(fake(bug), CASE, device="cpu")
    assert res.status is status, res.message
    assert fragment in res.message


def test_plus_inf_convention_passes_when_declared(fake):
    cand = fake("lse_plus_inf", support=Support(masked_lse="+inf"))
    assert check_case(cand, CASE, device="cpu").status is Status.PASSED


def test_race_check_needs_bitwise_equal_repeats(fake):
    flaky = fake("nondeterministic")
    assert check_case(flaky, CASE, device="cpu").status is Status.PASSED  # one run: fine
    res = check_case(fake("nondeterministic"), CASE, device="cpu", repeats=3)
    assert res.status is Status.FAILED and "nondeterministic" in res.message
    ok = check_case(fake(), CASE, device="cpu", repeats=3)
    assert ok.status is Status.PASSED and ok.extra["race_check"] == "3 runs bitwise equal"
    declared = fake("nondeterministic", support=Support(deterministic=False))
    res = check_case(declared, CASE, device="cpu", repeats=3)
    assert res.status is Status.PASSED and "skipped" in res.extra["race_check"]


def test_unsupported_case_is_skipped_with_reason(fake):
    cand = fake(support=Support(head_dims=frozenset({64, 128})))
    res = check_case(cand, CASE, device="cpu")
    assert res.status is Status.SKIPPED and "head_dim 32" in res.message
    assert cand.calls == 0


def test_secret_changes_the_inputs(fake):
    a = check_case(fake(), CASE, device="cpu", secret=0)
    b = check_case(fake(), CASE, device="cpu", secret=12345)
    assert a.status is b.status is Status.PASSED
    assert a.errors.out_err != b.errors.out_err or a.errors.base_err != b.errors.base_err


def test_runner_orders_summarises_and_exits(fake):
    cases = [CASE, Case(1, 2, 2, 5, 9, 16, "bfloat16", MaskKind.RANDOM)]
    cands = [fake(), fake("perturb"), fake("raise")]
    seen = []
    results = run_correctness(cands, cases, on_result=seen.append)
    assert [(r.kernel, r.case) for r in results] == [(c.name, k) for c in cands for k in cases]
    assert len(seen) == 6
    rows = {r.kernel: r for r in summarize(results)}
    assert rows["fake_none"].counts == {"passed": 2} and rows["fake_none"].failed == 0
    assert rows["fake_perturb"].counts == {"failed": 2} and rows["fake_perturb"].worst_ratio > 2
    assert rows["fake_raise"].counts == {"error": 2}
    assert "RuntimeError" in rows["fake_raise"].first_failure
    assert exit_code(results) == 1
    assert exit_code(results[:2]) == 0


def test_runner_skips_cuda_candidates_without_a_gpu(fake):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cand = fake()
    cand.device = "cuda"
    (res,) = run_correctness([cand], [CASE])
    assert res.status is Status.SKIPPED and "CUDA" in res.message
    assert exit_code([res]) == 0


def test_isolated_candidates_go_through_a_child_process():
    pytest.importorskip("harness.execution.isolate")
    results = run_correctness([isolated(), isolated("raise")], [CASE], timeout_s=120)
    assert [r.status for r in results] == [Status.PASSED, Status.ERROR], \
        [r.message for r in results]
    assert "kernel launch failed" in results[1].message


def test_smoke_grid_catches_every_planted_bug():
    """The default CI grid must expose every planted bug of the algorithm models."""
    models = pytest.importorskip("harness.candidates.models")
    if not hasattr(models, "planted_bugs"):
        pytest.skip("harness.candidates.models provides no planted bugs")
    from harness.core.grids import get_grid

    bugs = models.planted_bugs()
    assert bugs, "no planted bugs"
    cases = get_grid("smoke")
    missed = []
    for bug in bugs:
        for case in cases:  # stop at the first case that exposes the bug
            if check_case(bug, case, device="cpu").status in (Status.FAILED, Status.ERROR):
                break
        else:
            missed.append(bug.name)
    assert not missed, f"smoke grid passes planted bug(s): {missed}"


def test_suite_runs_each_isolated_candidate_in_one_child(tmp_path):
    """The pytest plugin batches an isolated candidate's cases into one child process."""
    tests_dir = Path(__file__).parent
    (tmp_path / "conftest.py").write_text(
        "from fake_candidates import isolated\n"
        "from harness.candidates import registry\n\n"
        "def _discover(kinds=registry.DEFAULT_KINDS):\n"
        "    return [] if tuple(kinds) == ('planted',) else [isolated(), isolated('perturb')]\n\n"
        "registry.discover = _discover\n")
    (tmp_path / "test_suite.py").write_text(
        "import pytest\n\n"
        "def test_c(fa_candidate, fa_case, fa_check):\n"
        "    res = fa_check(fa_candidate, fa_case)\n"
        "    if res.status.value != 'passed':\n"
        "        pytest.fail(res.message)\n")
    log = tmp_path / "children.log"
    env = dict(os.environ, FA_TEST_FACTORY_LOG=str(log),
               PYTHONPATH=os.pathsep.join([str(tests_dir), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "-q", "-p",
                           "no:cacheprovider", "--fa-grid", "smoke", "-k", "b2h4-113x203"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    last = proc.stdout.strip().splitlines()[-1]
    assert "10 failed, 10 passed" in last, proc.stdout[-3000:]
    assert "fake_perturb-b2h4-113x203-d64-fp16-none" in proc.stdout
    assert sorted(log.read_text().split()) == ["fake_none", "fake_perturb"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("bug,status", [("none", Status.PASSED), ("perturb", Status.FAILED),
                                        ("skip_row", Status.FAILED),
                                        ("write_after", Status.FAILED)])
def test_check_case_on_cuda(fake, bug, status):
    cand = fake(bug)
    cand.device = "cuda"
    res = check_case(cand, CASE, device="cuda", repeats=2)
    assert res.status is status, res.message
    # The oracle on the GPU agrees with the CPU one on the same (seeded) inputs.
    if bug == "none":
        cpu = check_case(fake(), CASE, device="cpu")
        assert res.errors.base_err == pytest.approx(cpu.errors.base_err, rel=0.5)


def test_registry_tolerates_only_a_missing_source(monkeypatch, tmp_path):
    from harness.candidates import registry

    (tmp_path / "fa_src_broken.py").write_text("def all_models(:\n")
    (tmp_path / "fa_src_nodep.py").write_text("import fa_no_such_dependency\n")
    (tmp_path / "fa_src_ok.py").write_text(
        "from fake_candidates import make_fake\n"
        "def all_models():\n    return [make_fake('perturb'), make_fake()]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_cache", {})
    monkeypatch.setattr(registry, "_notes", [])
    monkeypatch.setattr(registry, "_load_errors", [])
    monkeypatch.setitem(registry.SOURCES, "model", ("fa_src_missing", "all_models"))
    assert registry.discover(("model",)) == []
    assert registry.notes() == ["fa_src_missing is not present: its candidates are not "
                                "discovered"]
    for module, error in (("fa_src_broken", SyntaxError), ("fa_src_nodep", ImportError)):
        registry.clear_cache()
        monkeypatch.setitem(registry.SOURCES, "model", (module, "all_models"))
        with pytest.raises(error):
            registry.discover(("model",))
    registry.clear_cache()
    monkeypatch.setitem(registry.SOURCES, "model", ("fa_src_ok", "all_models"))
    assert [c.name for c in registry.discover(("model",))] == ["fake_none", "fake_perturb"]
    assert registry.available(registry.discover(("model",))[0])
    with pytest.raises(ValueError, match="no candidate matches 'x\\*'"):
        registry.select(registry.discover(("model",)), "fake_none,x*")
    assert [c.name for c in registry.select(registry.discover(("model",)), "fake_*")] == [
        "fake_none", "fake_perturb"]
    registry.clear_cache()


def test_parallel_children_give_the_serial_results_in_the_same_order():
    """The gate's correctness on a GPU runner: children side by side, the CPU models in
    children too, one candidate split into several children; the same verdicts, errors
    and order as one after the other."""
    from harness.candidates.registry import get_candidate

    cases = [Case(1, 2, 2, 17, 33, 16, "float16", MaskKind.CAUSAL_BR),
             Case(2, 2, 1, 9, 9, 32, "bfloat16", MaskKind.KEY_PADDING),
             Case(1, 2, 2, 5, 7, 16, "float16", MaskKind.NONE)]
    cands = [get_candidate("fa2_model"), get_candidate("naive_model"),
             get_candidate("bug_causal_off_by_one")]
    serial = run_correctness(cands, cases)
    seen: list[str] = []
    par = run_correctness(cands, cases, parallel=3, on_result=lambda r: seen.append(r.kernel),
                          split=lambda c: (lambda case: str(case.mask))
                          if c.name == "fa2_model" else None)
    assert [(r.kernel, r.case.id, r.status) for r in par] == \
        [(r.kernel, r.case.id, r.status) for r in serial]
    assert [r.errors.out_err for r in par] == [r.errors.out_err for r in serial]
    assert sorted(seen) == sorted(r.kernel for r in serial)
    assert any(r.status is Status.FAILED for r in par)  # the planted bug is still caught
