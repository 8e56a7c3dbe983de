"""check_case runs the candidate (and its repeats) before the oracle exists, keeps the
cached oracle on the CPU, and poisons the candidate's buffers before they are freed."""

from __future__ import annotations

import torch

from harness.core import check
from harness.core.candidate import Candidate, Support
from harness.core.cases import Case, MaskKind
from harness.core.reference import reference_for_case
from harness.core.results import Status

CASE = Case(1, 2, 2, 19, 23, 16, "float16", MaskKind.CAUSAL_BR)


class Spy(Candidate):
    def __init__(self, log: list[str]):
        super().__init__(name="spy", kind="model", device="cpu", support=Support())
        self.log = log
        self.outs: list[torch.Tensor] = []

    def run(self, case, inputs, out, lse) -> None:
        self.log.append("candidate")
        # Nothing about this case's answer is cached while the candidate runs.
        assert not any(k[0] == case for k in check._ORACLE_CACHE)
        ref_out, ref_lse = reference_for_case(case, inputs)
        out.copy_(ref_out.to(out.dtype))
        lse.copy_(ref_lse.to(lse.dtype))
        self.outs.append(out)


def test_candidate_and_repeats_run_before_the_oracle(monkeypatch):
    log: list[str] = []
    real = check.reference_for_case

    def oracle(case, inputs):
        log.append("oracle")
        return real(case, inputs)

    monkeypatch.setattr(check, "reference_for_case", oracle)
    check._ORACLE_CACHE.clear()
    spy = Spy(log)
    res = check.check_case(spy, CASE, device="cpu", repeats=3, oracle_device="cpu")
    assert res.status is Status.PASSED, res.message
    assert log == ["candidate", "candidate", "candidate", "oracle"]
    assert res.extra["race_check"] == "3 runs bitwise equal"
    (ref, base, _), = check._ORACLE_CACHE.values()
    assert all(t.device.type == "cpu" for t in (*ref, *base) if t is not None)
    # The buffer the candidate wrote its (correct) output into holds poison afterwards.
    assert torch.isnan(spy.outs[-1].float()).all()
