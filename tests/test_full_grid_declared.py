"""The full grid generated from what a Python candidate declares through its own
`supports()`, not from a probe at one dtype and one shape: a decode-only wrapper gets
decode cases, one refusing bf16 keeps its head dims with fp16, and one that runs nothing
of the grid is named with the reason on every front that prints the grid's summary."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from harness import pytest_plugin
from harness.candidates.python_candidate import PythonKernel, to_candidate
from harness.core.cases import MaskKind
from harness.core.grids import (
    FULL_DECODE_PAIRS,
    FULL_TARGET_CASES,
    ODD_HEAD_DIMS,
    _all_pairs,
    full_for,
    full_grid_for,
)
from harness.execution import runner
from harness.runs import run_grid as run_grid_mod
from harness.runs.grid_cases import resolve_grid
from harness.runs.run_grid import RunOptions, run_grid


def _never_called(q, k, v, **kw):  # noqa: ANN001, ANN003 - the protocol's signature
    raise AssertionError("the grid is generated without running the candidate")


def _candidate(name: str, supports: Any) -> Any:
    return to_candidate(PythonKernel(name=name, fn=_never_called, device="cpu",
                                     supports=supports), origin="test")


# A FlashInfer-style decode wrapper: one query row, any cache length.
DECODE = _candidate("decode_wrapper",
                    lambda c: None if c.seqlen_q == 1 else "decode only: one query row")
FP16_ONLY = _candidate("fp16_only",
                       lambda c: "bf16 needs sm90" if c.dtype == "bfloat16" else None)
NOTHING = _candidate("runs_nothing", lambda c: "needs a paged KV cache of its own format")


def test_a_decode_only_candidate_gets_decode_cases():
    cases = full_for(DECODE)
    assert cases and all(DECODE.supports(c) is None for c in cases)
    assert {c.seqlen_q for c in cases} == {1}
    pairs = {(c.seqlen_q, c.seqlen_k) for c in cases}
    # the grid's own one-row pairs and the decode grid's long caches
    assert pairs == {(1, 239), (1, 1)} | set(FULL_DECODE_PAIRS)
    assert {c.mask for c in cases} == set(MaskKind)
    assert len(cases) <= FULL_TARGET_CASES + len(pairs) * len(MaskKind)
    assert len(set(cases)) == len(cases)
    # long caches keep batch * heads small, as large pairs do
    assert all(c.batch * c.heads <= 8 for c in cases if c.seqlen_k > 4096)
    assert full_for(DECODE) == cases  # deterministic


def test_a_candidate_refusing_bf16_keeps_its_head_dims_with_fp16():
    cases = full_for(FP16_ONLY)
    assert cases and all(FP16_ONLY.supports(c) is None for c in cases)
    assert {c.dtype for c in cases} == {"float16"}
    assert {c.head_dim for c in cases} == {64, 128, *ODD_HEAD_DIMS}
    assert {(c.seqlen_q, c.seqlen_k, c.mask) for c in cases} == {
        (q, k, m) for q, k in _all_pairs() for m in MaskKind}
    assert len(cases) == FULL_TARGET_CASES


def test_a_candidate_that_runs_nothing_says_why():
    grid = full_grid_for(NOTHING)
    assert grid.cases == []
    assert "needs a paged KV cache of its own format" in grid.why_none
    (line,) = resolve_grid("full").no_case_lines([DECODE, NOTHING])
    assert line.startswith("runs_nothing: no case of grid full: ")
    assert line.endswith("needs a paged KV cache of its own format")
    # --cases that matches none of a candidate's own cases says so
    (line,) = resolve_grid("full", ["nomatch*"]).no_case_lines([DECODE])
    assert line == "decode_wrapper: no case of grid full: none of its cases matches --cases nomatch*"
    # a shared grid reports each refused case as a skip instead
    assert resolve_grid("smoke").no_case_lines([NOTHING]) == []


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: Any = "", **_kw: Any) -> None:
        self.lines.append(str(text))


def test_fa_harness_run_prints_the_line(monkeypatch):
    monkeypatch.setattr(runner, "run_correctness", lambda *a, **kw: [])
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(run_grid_mod, "select", lambda opts, cuda: [DECODE, NOTHING])
    console = _Console()
    run_grid(RunOptions(grid="full", no_store=True, no_progress=True), console, str)
    got = [x for x in console.lines if "no case of grid" in x]
    assert len(got) == 1 and got[0].startswith("runs_nothing: no case of grid full: ")


def test_the_pytest_plugin_prints_the_line(monkeypatch):
    monkeypatch.setattr(pytest_plugin, "selected_candidates", lambda config: [DECODE, NOTHING])
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    config = SimpleNamespace(stash=pytest.Stash(),
                             getoption=lambda name, default=None: {"--fa-grid": "full"}.get(
                                 name, default))
    definition = SimpleNamespace(get_closest_marker=lambda _name: None, config=config)
    names: set[str] = set()
    metafunc = SimpleNamespace(
        fixturenames=["fa_candidate_name", "fa_case"], definition=definition, config=config,
        parametrize=lambda _n, params: names.update(p.values[0] for p in params))
    pytest_plugin.pytest_generate_tests(metafunc)
    assert names == {"decode_wrapper"}
    written: list[str] = []
    reporter = SimpleNamespace(write_line=written.append)
    config.pluginmanager = SimpleNamespace(get_plugin=lambda _name: reporter)
    pytest_plugin.pytest_collection_finish(SimpleNamespace(items=[], config=config))
    assert [x for x in written if "no case of grid" in x] == [
        "runs_nothing: no case of grid full: it refuses every case of the grid it was asked "
        "about, e.g. needs a paged KV cache of its own format"]
    assert "PYTEST_XDIST_WORKER" not in os.environ


def test_the_gate_logs_the_line():
    from harness.runs.gate_prepare import gate_grids

    lines = gate_grids(["smoke", "full"]).correctness_lines([DECODE, NOTHING], 1)
    assert lines[0].startswith("correctness: ") and "generated per candidate" in lines[0]
    assert lines[1:] == ["runs_nothing: no case of grid full: it refuses every case of the "
                         "grid it was asked about, e.g. needs a paged KV cache of its own format"]
    assert gate_grids(["smoke"]).correctness_lines([NOTHING], 2) == [
        "correctness: 25 case(s) x 1 candidate(s), 2 at a time"]


def test_under_xdist_the_controller_prints_the_workers_lines():
    line = "runs_nothing: no case of grid full: why"
    config = SimpleNamespace(stash=pytest.Stash())
    for _ in range(2):  # two workers collected the same grid: the line is printed once
        pytest_plugin.pytest_testnodedown(
            SimpleNamespace(config=config,
                            workeroutput={pytest_plugin._NO_CASE_OUTPUT: [line]}), None)
    written: list[str] = []
    pytest_plugin.pytest_terminal_summary(SimpleNamespace(write_line=written.append), 0,
                                          config)
    assert written == [line]
