"""One grid name, the same cases and the same pass on every front: `fa-harness run`,
`fa-harness ci` (harness.runs.gate_run.execute) and the pytest plugin resolve a grid
through harness.runs.grid_cases.resolve_grid. The full grid is generated per candidate
(harness.core.grids.cases_for), so a front that ran its shared list would judge other
cases than the others; perf-bwd goes through the backward (harness.core.grids.grid_pass)
wherever it is named. Runs on a CPU: each front's call to the runner is captured."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from harness import pytest_plugin
from harness.core.grids import cases_for, get_grid
from harness.execution import runner
from harness.runs import gate_run
from harness.runs.gate_options import GateOptions
from harness.runs.gate_prepare import gate_grids
from harness.runs.grid_cases import resolve_grid
from harness.runs.run_grid import RunOptions, run_grid

NAMES = ("fa2_model", "naive_model")


class _Captured(Exception):
    pass


def _capture(calls: list[dict[str, Any]]) -> Any:
    """A run_correctness that records what each candidate would run, then stops the run."""

    def fake(candidates: Any, cases: Any, **kw: Any) -> Any:
        per = kw.get("cases_for")
        calls.append({"cases": {c.name: [k.id for k in (per(c) if per else cases)]
                                for c in candidates},
                      "backward": kw.get("backward", False)})
        raise _Captured

    return fake


def _candidates() -> list[Any]:
    from harness.candidates import registry

    return registry.select(registry.discover(), ",".join(NAMES))


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: Any = "", **_kw: Any) -> None:
        self.lines.append(str(text))


def _run_front(monkeypatch: pytest.MonkeyPatch, grid: str) -> dict[str, Any]:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(runner, "run_correctness", _capture(calls))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(_Captured):
        run_grid(RunOptions(grid=grid, kernels=",".join(NAMES), no_store=True), _Console(),
                 str)
    (call,) = calls
    return call


def _ci_front(monkeypatch: pytest.MonkeyPatch, grids: list[str]) -> tuple[dict[str, Any],
                                                                            list[str]]:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(runner, "run_correctness", _capture(calls))
    monkeypatch.setattr(gate_run, "gpu_state", lambda: (False, "no GPU in this test"))
    logged: list[str] = []
    with pytest.raises(_Captured):
        gate_run.execute(GateOptions(grids=grids, kernels=list(NAMES), sanitize="none",
                                     jobs=1), log=logged.append)
    (call,) = calls
    return call, logged


def _plugin_front(grid: str) -> dict[str, list[str]]:
    """The (candidate, case) pairs the plugin parametrizes the suites with."""
    config = SimpleNamespace(stash=pytest.Stash(),
                             getoption=lambda name, default=None: {
                                 "--fa-grid": grid, "--fa-kernels": ",".join(NAMES)}.get(
                                 name, default))
    definition = SimpleNamespace(get_closest_marker=lambda _name: None, config=config)
    got: dict[str, list[str]] = {}

    def parametrize(_names: Any, params: list[Any]) -> None:
        for p in params:
            name, case = p.values
            got.setdefault(name, []).append(case.id)

    metafunc = SimpleNamespace(fixturenames=["fa_candidate_name", "fa_case"],
                               definition=definition, config=config, parametrize=parametrize)
    pytest_plugin.pytest_generate_tests(metafunc)
    return got


def test_full_grid_gives_every_front_the_same_cases_per_candidate(monkeypatch):
    expected = {c.name: [k.id for k in cases_for("full", c)] for c in _candidates()}
    # The per-candidate cases are not the shared list: a front that ran the shared list
    # (the gate did) would judge other cases.
    assert set(expected["fa2_model"]) != {k.id for k in get_grid("full")}
    run = _run_front(monkeypatch, "full")
    ci, _ = _ci_front(monkeypatch, ["full"])
    plugin = _plugin_front("full")
    assert run["cases"] == expected
    assert ci["cases"] == expected
    assert plugin == expected


def test_shared_grid_is_the_same_on_every_front(monkeypatch):
    smoke = [k.id for k in get_grid("smoke")]
    expected = {n: smoke for n in NAMES}
    assert _run_front(monkeypatch, "smoke")["cases"] == expected
    assert _ci_front(monkeypatch, ["smoke"])[0]["cases"] == expected
    assert _plugin_front("smoke") == expected


def test_perf_bwd_is_timed_through_the_backward_in_the_gate(monkeypatch):
    grids = gate_grids(["smoke", "perf-bwd"])
    assert not grids.timed and [g.name for g in grids.timed_bwd] == ["perf-bwd"]
    assert grids.backward_pool == list(resolve_grid("perf-bwd").cases)
    # On a CPU the gate says the backward's timing grid was not run, and never checks its
    # large cases through the forward as a correctness grid.
    call, logged = _ci_front(monkeypatch, ["smoke", "perf-bwd"])
    smoke = [k.id for k in get_grid("smoke")]
    assert call["cases"] == {n: smoke for n in NAMES} and not call["backward"]
    assert resolve_grid("perf-bwd").backward and resolve_grid("perf-bwd").timing
    assert not resolve_grid("perf").backward


def test_perf_bwd_not_run_without_a_gpu_note(monkeypatch):
    monkeypatch.setattr(runner, "run_correctness", lambda *a, **k: [])
    monkeypatch.setattr(gate_run, "gpu_state", lambda: (False, "no GPU in this test"))
    ex = gate_run.execute(GateOptions(grids=["perf-bwd"], kernels=list(NAMES),
                                      sanitize="none", jobs=1), log=lambda _line: None)
    assert "grid perf-bwd: timing needs a GPU; not run" in ex.notes
    assert not ex.results


@pytest.mark.fa_grid("perf-bwd")
def test_plugin_checks_perf_bwd_through_the_backward(monkeypatch, fa_check):
    seen: list[bool] = []

    def fake(candidates: Any, cases: Any, **kw: Any) -> list[Any]:
        seen.append(kw.get("backward", False))
        return [SimpleNamespace(case=k) for k in cases]

    monkeypatch.setattr(runner, "run_correctness", fake)
    (cand,) = [c for c in _candidates() if c.name == "fa2_model"]
    fa_check(cand, get_grid("perf-bwd")[0])
    assert seen == [True]
