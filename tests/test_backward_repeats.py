"""Every call of a backward is judged against the oracle, whatever its declared
determinism, and every case gets at least two calls (harness.core.check_grad): the planted
backward that is right only on its first call per case (its dQ accumulator zeroed by the
harness once per case, never by itself) fails `run --backward --repeats 2` and the gate's
backward correctness, where a backward that only differs in its last bits between calls
passes with the difference noted."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from harness.candidates import registry
from harness.candidates.models import FA2Model
from harness.candidates.models.planted_bwd import FirstCallOnly
from harness.cli import main as cli_main
from harness.core import check_grad, grids
from harness.core.candidate import Support
from harness.core.cases import Case, MaskKind
from harness.core.check_grad import check_backward_case
from harness.core.results import Status
from harness.runs import gate_run

CASE = Case(1, 2, 2, 33, 47, 32, "float16", MaskKind.NONE)
TINY = [Case(1, 2, 2, 17, 33, 16, "float16", MaskKind.CAUSAL_BR),
        Case(2, 2, 1, 9, 9, 32, "bfloat16", MaskKind.KEY_PADDING)]


def test_the_planted_backward_is_right_on_its_first_call_only(monkeypatch):
    # One call per case (the old protocol): it passes, so only a repeat can expose it.
    monkeypatch.setattr(check_grad, "MIN_CALLS", 1)
    res = check_backward_case(FirstCallOnly(), CASE, device="cpu")
    assert res.status is Status.PASSED, res.message
    # Its repeats differ from the first call and it declares itself nondeterministic: the
    # difference alone fails nothing, the repeat's values do.
    res = check_backward_case(FirstCallOnly(), CASE, device="cpu", repeats=2)
    assert res.status is Status.FAILED, res.message
    assert res.message.startswith("repeat 1 (call 2 of 2; the first passed): dq: max error")
    assert "dk:" not in res.message and "dv:" not in res.message


def test_every_case_gets_two_calls_even_with_repeats_1():
    res = check_backward_case(FirstCallOnly(), CASE, device="cpu", repeats=1)
    assert res.status is Status.FAILED and res.message.startswith("repeat 1 "), res.message
    ok = check_backward_case(FA2Model(), CASE, device="cpu", repeats=1)
    assert ok.status is Status.PASSED and ok.extra["determinism"] == "2 runs bitwise equal"


@dataclass
class LastBitJitter(FA2Model):
    """Right on every call, with a last-bit difference on every other one (as dQ by
    atomics gives), declared nondeterministic."""

    name: str = "last_bit_jitter"
    calls: int = 0

    def __post_init__(self) -> None:
        self.support = Support(masked_lse="-inf", backward=True, backward_deterministic=False)

    def run_backward(self, case, inputs, dq, dk, dv) -> None:
        super().run_backward(case, inputs, dq, dk, dv)
        self.calls += 1
        if self.calls % 2 == 0:
            dq.view(torch.int16)[0, 0, 0, 0] ^= 1  # fp16 or bf16: flip the last bit


def test_a_nondeterministic_backward_right_on_every_call_passes_with_a_note():
    res = check_backward_case(LastBitJitter(), CASE, device="cpu", repeats=3)
    assert res.status is Status.PASSED, res.message
    assert res.extra["determinism"] == ("not bitwise deterministic: 1 of 2 repeat(s) differ "
                                        "bitwise from the first call (repeat 1 first)")
    # declared deterministic, the same difference fails
    det = LastBitJitter()
    det.support = Support(masked_lse="-inf", backward=True, backward_deterministic=True)
    res = check_backward_case(det, CASE, device="cpu", repeats=3)
    assert res.status is Status.FAILED
    assert res.message.startswith("nondeterministic backward (declared deterministic)")


@pytest.fixture
def tiny_grid(monkeypatch, tmp_path):
    monkeypatch.setitem(grids.GRIDS, "tiny", lambda: list(TINY))
    monkeypatch.setenv("FA_HARNESS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def test_run_backward_with_repeats_fails_the_planted_backward(tiny_grid, capsys):
    args = ["run", "--grid", "tiny", "--backward", "--repeats", "2", "--no-store",
            "--no-progress", "--device", "cpu"]
    assert cli_main(args + ["--kernels", "fa2_model"]) == 0
    assert cli_main(args + ["--kernels", "bug_bwd_first_call_only"]) == 1
    out = capsys.readouterr().out
    assert "repeat 1 (call 2 of 2; the first passed): dq: max error" in out, out[-3000:]


def test_the_gate_fails_the_planted_backward(tiny_grid, tmp_path, monkeypatch, capsys):
    pool = [FA2Model(), FirstCallOnly()]
    monkeypatch.setattr(registry, "discover", lambda kinds=registry.DEFAULT_KINDS: (
        [] if tuple(kinds) == ("planted",) else list(pool)))
    monkeypatch.setattr(registry, "load_errors", lambda: [])
    monkeypatch.setattr(gate_run, "gpu_state", lambda: (False, "no GPU in this test"))
    monkeypatch.setenv("FA_HARNESS_COMMIT", "3" * 40)
    args = ["ci", "--grid", "tiny", "--db", str(tmp_path / "ci.sqlite"),
            "--summary", str(tmp_path / "s.md")]
    assert cli_main(args + ["--kernels", "fa2_model"]) == 0
    assert cli_main(args + ["--kernels", "bug_bwd_first_call_only"]) == 1
    summary = (tmp_path / "s.md").read_text()
    assert "fa-harness CI: FAILED" in summary
    assert "bug_bwd_first_call_only" in summary and "repeat 1 (call 2 of 2" in summary, summary
