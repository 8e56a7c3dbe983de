"""Isolation: a hang, an exception, a hard death or a memory blow-up in one case becomes
that case's verdict; after an exception or a death the remaining cases still run in a
fresh child, after a hang (or a lost CUDA context) they are reported as not run."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import pytest
import torch

from harness.core.candidate import Candidate
from harness.core.cases import Case, MaskKind
from harness.core.results import CaseResult, Status
from harness.execution.isolate import is_cuda_fatal, run_isolated

# Behaviour is chosen by the case's head_dim, so one fake candidate covers every fault.
OK, HANG, RAISE, EXIT, SEGV, HOG = 16, 17, 18, 19, 20, 21


def case(d: int, seed: int = 0) -> Case:
    return Case(1, 1, 1, 4, 4, d, "float16", MaskKind.NONE, seed)


@dataclass
class Misbehaving(Candidate):
    def run(self, case, inputs, out, lse) -> None:
        d = case.head_dim
        if d == HANG:
            time.sleep(3600)
        if d == RAISE:
            raise ValueError("planned failure in run()")
        if d == EXIT:
            os._exit(7)
        if d == SEGV:
            os.kill(os.getpid(), signal.SIGSEGV)
        if d == HOG:
            import numpy as np

            hog = np.ones(1 << 27)  # 1 GiB, written: resident
            time.sleep(30)
            del hog
        out.zero_()


def make_fake(name: str) -> Candidate:
    return Misbehaving(name=name, kind="model", device="cpu")


def trivial_case_fn(candidate: Candidate, case: Case, options: dict) -> CaseResult:
    """Runs the candidate once on zeros: isolation is under test, not the check."""
    q = torch.zeros(case.batch, case.heads, case.seqlen_q, case.head_dim, dtype=torch.float16)
    from harness.core.cases import Inputs

    candidate.run(case, Inputs(q, q, q), torch.empty_like(q), None)
    return CaseResult(candidate.name, case, Status.PASSED, f"pid {os.getpid()}")


OPTS = {"factory": f"{__name__}:make_fake", "case_fn": f"{__name__}:trivial_case_fn"}


def run(cases, timeout_s=20.0, **extra):
    return run_isolated("fake", cases, mode="check", options={**OPTS, **extra},
                        timeout_s=timeout_s)


def test_every_fault_becomes_a_verdict_and_the_next_case_still_runs(tmp_path, monkeypatch):
    starts = tmp_path / "starts"
    monkeypatch.setenv("FA_TEST_START_LOG", str(starts))
    res = run([case(OK, 1), case(OK, 2), case(RAISE), case(EXIT), case(SEGV), case(OK, 3),
               case(HANG), case(OK, 4)], timeout_s=2.0, factory=f"{__name__}:make_logged_fake")
    assert [r.status for r in res] == [Status.PASSED, Status.PASSED, Status.ERROR,
                                       Status.CRASHED, Status.CRASHED, Status.PASSED,
                                       Status.TIMEOUT, Status.SKIPPED], [r.message for r in res]
    # no restart without a reason: the first cases and the exception share one child
    assert res[0].message == res[1].message
    assert "planned failure" in res[2].message
    assert "exited with code 7" in res[3].message
    assert "SIGSEGV" in res[4].message
    # faulthandler writes the Python traceback to the redirected stderr: the tail has it
    assert "Fatal Python error" in res[4].message or "Segmentation fault" in res[4].message
    assert res[5].message != res[0].message  # a fresh child ran the case after the crashes
    assert "2 s" in res[6].message and "SIGKILL" in res[6].message
    assert res[7].message == f"not run: {case(HANG).id} hung for 2 s"
    # Children counted, not seconds (a loaded runner makes every start-up slow): one for
    # the cases up to the exit, one after it, one after the segfault; none after the hang.
    assert starts.read_text().count("start\n") == 3


def test_a_hanging_candidate_costs_one_timeout_not_one_per_case(tmp_path, monkeypatch):
    """Five hanging cases: one deadline and one child, not five of each (counted by the
    factory, which every child calls once; wall time is too noisy on a shared runner)."""
    starts = tmp_path / "starts"
    monkeypatch.setenv("FA_TEST_START_LOG", str(starts))
    cases = [case(OK)] + [case(HANG, seed) for seed in range(5)]
    res = run(cases, timeout_s=1.5, factory=f"{__name__}:make_logged_fake")
    assert [r.status for r in res] == [Status.PASSED, Status.TIMEOUT] + [Status.SKIPPED] * 4
    assert all(r.message == f"not run: {cases[1].id} hung for 1.5 s" for r in res[2:])
    assert starts.read_text().count("start\n") == 1


def make_logged_fake(name: str) -> Candidate:
    with open(os.environ["FA_TEST_START_LOG"], "a") as f:
        f.write("start\n")
    return make_fake(name)


def test_a_hanging_isolated_candidate_in_the_runner_is_one_timeout():
    """The same through the correctness runner, with the shared fake candidate."""
    from fake_candidates import isolated

    from harness.core.grids import get_grid
    from harness.execution.runner import run_correctness

    cases = get_grid("smoke")[:4]
    res = run_correctness([isolated("hang")], cases, timeout_s=2.0)
    assert [r.status for r in res] == [Status.TIMEOUT] + [Status.SKIPPED] * 3, \
        [r.message for r in res]
    assert res[1].message == f"not run: {cases[0].id} hung for 2 s"


def test_memory_watchdog_kills_a_hog():
    res = run([case(HOG), case(OK)], max_rss_mb=800)
    assert res[0].status is Status.CRASHED
    assert "host memory limit" in res[0].message
    assert res[1].status is Status.PASSED


def test_build_error_is_reported_for_every_case():
    res = run_isolated("nope", [case(OK), case(OK, 1)], mode="check",
                       options={"factory": "harness.no_such_module:make"}, timeout_s=10)
    assert all(r.status is Status.ERROR for r in res)
    assert "could not build candidate" in res[0].message
    assert "no_such_module" in res[0].message


def test_bad_mode_is_rejected_before_spawning():
    with pytest.raises(ValueError, match="mode"):
        run_isolated("fake", [case(OK)], mode="bogus", options=OPTS, timeout_s=5)


def test_default_check_mode_runs_the_real_check_in_the_child():
    res = run_isolated("sdpa_math", [case(OK), Case(2, 4, 2, 9, 13, 16, "float16",
                                                     MaskKind.CAUSAL_BR, 3)],
                       mode="check", options={"device": "cpu"}, timeout_s=120)
    assert [r.status for r in res] == [Status.PASSED, Status.PASSED], [r.message for r in res]
    assert res[1].errors.out_err is not None


def test_cuda_fatal_markers():
    assert is_cuda_fatal("CUDA error: an illegal memory access was encountered")
    assert is_cuda_fatal("cudaErrorIllegalAddress")
    assert not is_cuda_fatal("ValueError: shapes do not match")


def test_gated_children_start_side_by_side_and_run_in_turn():
    """The gate's timing phase: every timing child is started at once and built, then
    each runs only on its turn, so one start-up is paid for all and no two time at once."""
    import threading
    import time

    from harness.core.cases import Case, MaskKind

    cases = [Case(1, 2, 2, 17, 33, 16, "float16", MaskKind.CAUSAL_BR),
             Case(1, 2, 2, 9, 9, 16, "float16", MaskKind.NONE)]
    ready = {n: threading.Event() for n in ("fa2_model", "naive_model")}
    go = {n: threading.Event() for n in ready}
    events: list[tuple[str, str, float]] = []

    def turn(name):
        def wait():
            events.append((name, "ready", time.monotonic()))
            ready[name].set()
            go[name].wait()
        return wait

    out: dict[str, list] = {}

    def run(name):
        out[name] = run_isolated(name, cases, options={"device": "cpu"}, turn=turn(name),
                                 on_result=lambda r: events.append((r.kernel, "result",
                                                                    time.monotonic())))

    threads = [threading.Thread(target=run, args=(n,)) for n in ready]
    for t in threads:
        t.start()
    for n in ready:
        assert ready[n].wait(120), f"{n} never got ready"
    assert not any(kind == "result" for _, kind, _ in events)  # built, waiting
    for n, t in zip(ready, threads, strict=True):
        go[n].set()
        t.join(120)
    assert [r.status.value for n in ready for r in out[n]] == ["passed"] * 4
    first_b = min(t for n, k, t in events if n == "naive_model" and k == "result")
    last_a = max(t for n, k, t in events if n == "fa2_model" and k == "result")
    assert last_a < first_b  # one after the other


def test_a_gated_child_that_cannot_be_built_still_takes_its_turn():
    import threading

    from harness.core.cases import Case

    took = threading.Event()
    res = run_isolated("no_such_candidate", [Case(1, 1, 1, 4, 4, 16)],
                       options={"device": "cpu"}, turn=took.set)
    assert took.is_set() and res[0].status.value == "error"
