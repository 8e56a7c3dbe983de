"""What the command line says beats a candidate's manifest, which beats the project's
pyproject.toml: `fa-harness ci --timing-min 5` times an owned candidate whose manifest asks
for `timing_min = 3` on 5 cases, and `--timing-cases` beats a manifest's `timing_cases`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.cli import build_parser
from harness.core.cases import Case
from harness.core.grids import get_grid
from harness.runs import gate
from harness.runs.gate_options import GateOptions, timing_kw
from harness.runs.plan import make_plan


@dataclass
class Cand:
    name: str
    kind: str = "cuda"
    device: str = "cuda"
    isolate: bool = True
    meta: dict[str, Any] = field(default_factory=dict)

    def supports(self, case: Case) -> str | None:
        return None


def _plan(opts: GateOptions) -> Any:
    cands = [Cand("mine", meta={"timing_min": 3, "timing_cases": 5}), Cand("other")]
    return make_plan(cands, [], get_grid("perf"), budget_min=30, owned=["mine", "other"],
                     **timing_kw(opts))


def _ci_options(monkeypatch, argv: list[str]) -> GateOptions:
    """The GateOptions `fa-harness ci` builds from `argv` (the gate itself not run)."""
    seen: list[GateOptions] = []

    def fake_run_gate(opts: GateOptions, **_kw: Any) -> Any:
        seen.append(opts)
        raise gate.GateNotMeasured("stopped by the test")

    monkeypatch.setattr(gate, "run_gate", fake_run_gate)
    args = build_parser().parse_args(["ci", *argv])
    assert args.func(args) == 3
    (opts,) = seen
    return opts


def test_command_line_timing_beats_the_manifest(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no pyproject.toml: the defaults
    p = _plan(_ci_options(monkeypatch, ["--timing-min", "6", "--timing-cases", "7"]))
    assert p.minimum == {"mine": 6, "other": 6}
    assert len(p.timed["mine"]) == len(p.timed["other"]) == 7


def test_manifest_beats_the_project_without_a_command_line_value(monkeypatch, tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.fa-harness]\ntiming-min = 4\ntiming-cases = 6\n')
    monkeypatch.chdir(tmp_path)
    p = _plan(_ci_options(monkeypatch, []))
    assert p.minimum == {"mine": 3, "other": 4}
    assert len(p.timed["mine"]) == 5 and len(p.timed["other"]) == 6
    # The command line beats both, the floor alone as well.
    p = _plan(GateOptions(timing_min=2))
    assert p.minimum == {"mine": 2, "other": 2}
    assert len(p.timed["mine"]) == 5 and len(p.timed["other"]) == 6
