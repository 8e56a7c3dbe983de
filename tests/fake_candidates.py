"""A candidate for the harness core's own tests: the naive implementation in float32 (good
enough to pass the tolerance rule), optionally with one named bug planted, so the checks
are tested without depending on the algorithm models."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.core.candidate import Candidate
from harness.core.cases import Case, Inputs
from harness.core.reference import attention_naive, case_flags

BUGS = ("none", "perturb", "nan", "skip_row", "masked_nonzero", "lse_off", "lse_plus_inf",
        "modify_input", "write_after", "write_before", "raise", "nondeterministic",
        "skip_lse_row", "hang")


@dataclass
class FakeCandidate(Candidate):
    bug: str = "none"
    calls: int = 0

    def run(self, case: Case, inputs: Inputs, out: torch.Tensor, lse: torch.Tensor | None) -> None:
        self.calls += 1
        if self.bug == "hang":  # a kernel that never returns (isolated tests only)
            import time

            time.sleep(3600)
        if self.bug == "raise":
            raise RuntimeError("kernel launch failed: too many resources requested")
        o, lse_val = attention_naive(inputs.q.float(), inputs.k.float(), inputs.v.float(),
                                     **case_flags(case, inputs))
        if self.bug == "perturb":
            o = o + 0.05 * o.abs().max()
        if self.bug == "masked_nonzero":
            o = torch.where(torch.isneginf(lse_val)[..., None], torch.full_like(o, 1e-3), o)
        if self.bug == "nondeterministic":
            o[0, 0, -1, 0] += 1e-3 * (self.calls % 2)  # the last row always sees keys
        if self.bug == "skip_row":
            out[:, :, :-1].copy_(o[:, :, :-1])
        else:
            out.copy_(o)
        if self.bug == "nan":
            out[0, -1, 0, -1] = float("nan")
        if self.bug == "modify_input":
            inputs.k[0, 0, 0, 0] += 1.0
        if self.bug in ("write_after", "write_before"):
            # A stray store just past (or before) the output, through the buffer's storage.
            offset = out.storage_offset() + (out.numel() if self.bug == "write_after" else -1)
            torch.as_strided(out, (1,), (1,), offset).fill_(1.0)
        if lse is not None:
            if self.bug == "lse_off":
                lse_val = lse_val + 0.01
            if self.bug == "lse_plus_inf":
                inf = torch.full_like(lse_val, float("inf"))
                lse_val = torch.where(torch.isneginf(lse_val), inf, lse_val)
            if self.bug == "skip_lse_row":
                lse[:, :, 1:].copy_(lse_val[:, :, 1:])
            else:
                lse.copy_(lse_val)


def make_fake(bug: str = "none", **kw) -> FakeCandidate:
    assert bug in BUGS, bug
    return FakeCandidate(name=f"fake_{bug}", kind="model", device="cpu", algorithm="naive_fused",
                         bug=bug, **kw)



def build_isolated(name: str) -> FakeCandidate:
    """Factory an isolated child calls (harness.execution.isolate option "factory"): the fake named
    `fake_<bug>`, isolated. Appends a line to $FA_TEST_FACTORY_LOG when set, so a test can
    count how many children were started."""
    import os

    log = os.environ.get("FA_TEST_FACTORY_LOG")
    if log:
        with open(log, "a") as f:
            f.write(name + "\n")
    return isolated(name.removeprefix("fake_"))


def isolated(bug: str = "none") -> FakeCandidate:
    cand = make_fake(bug, isolate=True,
                     meta={"isolate_options": {"factory": "fake_candidates:build_isolated"}})
    return cand
