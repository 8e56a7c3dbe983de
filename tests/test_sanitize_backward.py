"""compute-sanitizer on a backward, without a GPU: the command line each place would run
(the gate's tier and `run --sanitize` through `sanitize_variants`, the submission worker's
backward stage), with a stand-in for compute-sanitizer that records its arguments. The
planted variants under tests/data/planted_bwd declare a backward; the template does not.
What the tool finds on a GPU: tests/test_planted_bwd_gpu.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.candidates.cuda_candidate import CudaVariant
from harness.candidates.variants import load_variant
from harness.core.candidate import Candidate, Support
from harness.core.cases import Case, MaskKind
from harness.core.reference import reference_for_case
from harness.core.reference_grad import grad_reference_for_case
from harness.execution import sanitize
from harness.submissions.scoring import ScoringOptions
from harness.submissions.scoring_bwd import score_passes

DATA = Path(__file__).parent / "data"
PLANTED = DATA / "planted_bwd" / "planted_bwd"
TEMPLATE = Path(sanitize.__file__).parents[1] / "kernels" / "template"
REPORTS = DATA / "sanitizer"


def _variant(path: Path, name: str | None = None) -> CudaVariant:
    return CudaVariant.from_spec(load_variant(str(path), name))


@pytest.fixture
def fake_sanitizer(tmp_path, monkeypatch):
    """A compute-sanitizer that logs its arguments; memcheck reports the far write when the
    target runs a backward, everything else is clean."""
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(f"""#!/bin/sh
[ "$1" = "--help" ] && exit 0
echo "$@" >> {tmp_path}/calls
case "$2 $*" in
  memcheck*--backward*) cat {REPORTS}/memcheck_oob.txt ;;
  *) cat {REPORTS}/memcheck_clean.txt ;;
esac
""")
    fake.chmod(0o755)
    monkeypatch.setenv(sanitize.ENV_VAR, str(fake))
    sanitize._supports_padding.cache_clear()
    return tmp_path / "calls"


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_the_command_line_names_the_passes():
    cases = [Case(1, 2, 2, 64, 64, 64, "float16", MaskKind.NONE)]
    base = sanitize.command("cs", "memcheck", "v", cases, trusted=True)
    assert "--backward" not in base and "--no-forward" not in base
    both = sanitize.command("cs", "memcheck", "v", cases, trusted=True, passes=("fwd", "bwd"))
    assert "--backward" in both and "--no-forward" not in both
    bwd = sanitize.command("cs", "memcheck", "v", cases, passes=("bwd",))
    assert bwd[-2:] == ["--backward", "--no-forward"]
    with pytest.raises(ValueError):
        sanitize.command("cs", "memcheck", "v", cases, passes=())


def test_the_gate_tier_and_run_sanitize_check_a_declared_backward(fake_sanitizer):
    planted, template = _variant(PLANTED, "planted_bwd_far_write"), _variant(TEMPLATE)
    assert planted.support.backward and not template.support.backward
    assert sanitize.variant_passes(planted) == ("fwd", "bwd")
    assert sanitize.variant_passes(template) == ("fwd",)
    # the gate's call (harness.runs.gate_run): the fast tier on the owned variants
    outcomes = sanitize.sanitize_variants([planted, template], tier="fast", trusted=True)
    by_name = {o.name: o for o in outcomes}
    bad, ok = by_name["planted_bwd_far_write"], by_name["template"]
    assert bad.failed and "memcheck: 2 errors: Invalid __global__ write" in bad.line
    assert not ok.failed and "forward," in ok.line and "backward" not in ok.line
    calls = _calls(fake_sanitizer)
    mine = [c for c in calls if "--name planted_bwd_far_write" in c]
    assert len(mine) == 3 and all("--backward" in c and "--no-forward" not in c
                                  and c.endswith("--trusted") for c in mine)
    assert str(PLANTED) in mine[0]
    assert not any("--backward" in c for c in calls if "--name template" in c)
    # `fa-harness run --sanitize`: every tool, the backward's launches too
    lines = sanitize.sanitize_candidates([planted])
    assert lines and lines[0][1] and "Invalid __global__ write" in lines[0][0]
    run_calls = _calls(fake_sanitizer)[len(calls):]
    assert sorted(c.split()[1] for c in run_calls) == sorted(sanitize.TOOLS)
    assert all("--backward" in c for c in run_calls)


@dataclass
class Exact(Candidate):
    """Forward and backward from the float64 oracles: right, fast enough to score on the
    CPU."""

    name: str = "exact"
    kind: str = "model"
    device: str = "cpu"
    support: Support = field(default_factory=lambda: Support(
        backward=True, backward_deterministic=True))

    def run(self, case, inputs, out, lse) -> None:
        ref_out, ref_lse = reference_for_case(case, inputs)
        out.copy_(ref_out.to(out.dtype))
        if lse is not None:
            lse.copy_(ref_lse.to(lse.dtype))

    def run_backward(self, case, inputs, dq, dk, dv) -> None:
        for buf, got in zip((dq, dk, dv), grad_reference_for_case(case, inputs, inputs.dout),
                            strict=True):
            buf.copy_(got.to(buf.dtype))


CASES = [Case(1, 2, 2, 16, 24, 32, "float16", MaskKind.CAUSAL_BR)]
PERF = [Case(1, 2, 2, 32, 32, 32, "float16", MaskKind.NONE)]


def _options(**kw) -> ScoringOptions:
    return ScoringOptions(device="cpu", correctness_cases=CASES, perf_cases=PERF,
                          perf_bwd_cases=PERF, min_samples=3, min_time_s=0.0,
                          max_time_s=0.5, warmup_calls=1, slow_cut_factor=0.0,
                          ceilings={"copy_gbps": 1e9, "matmul_tflops": 1e9}, **kw)


def _clean() -> sanitize.SanitizeReport:
    return sanitize.SanitizeReport("clean", [sanitize.ToolReport("memcheck", "clean")], [])


def test_the_worker_sanitizes_the_backward_on_its_own(monkeypatch):
    """The forward's stage runs what the worker gives (`sanitizer`); the backward's own runs
    the backward's launches alone: its finding fails the backward, not the forward."""
    seen: list[dict] = []

    def fake(path, support, names, **kw):
        seen.append({"path": path, **kw})
        tool = sanitize.ToolReport("memcheck", "findings", 1, "memcheck: 1 error: Invalid "
                                   "__global__ write of size 2 bytes in planted_bwd_main_fp16")
        return sanitize.SanitizeReport("findings", [tool], [])

    monkeypatch.setattr(sanitize, "sanitize", fake)
    progress: list[tuple[str, str]] = []
    rep = score_passes(Exact(), _options(), secret=5, baseline=Exact(name="base"),
                       sanitizer=_clean, variant_path="/nowhere/planted_bwd",
                       progress=lambda s, c: progress.append((s, c)))
    assert rep.verdict == "scored" and rep.detail["sanitizer"]["status"] == "clean"
    b = rep.backward
    assert b is not None and b.verdict == "incorrect" and b.score is None, b.message
    assert b.message.startswith("backward: memcheck: 1 error: Invalid __global__ write")
    assert b.detail["sanitizer"]["status"] == "findings" and "perf" not in b.detail
    assert seen == [{"path": "/nowhere/planted_bwd", "timeout_s": 50.0, "passes": ("bwd",)}]
    assert ("sanitize", "backward") in progress  # the watchdog's allowance for the stage


def test_no_backward_stage_where_the_forward_has_none(monkeypatch):
    monkeypatch.setattr(sanitize, "sanitize", lambda *a, **k: pytest.fail("sanitized"))
    rep = score_passes(Exact(), _options(), secret=5, baseline=Exact(name="base"),
                       variant_path="/nowhere/planted_bwd")
    assert rep.backward is not None and rep.backward.verdict == "scored", rep.backward.message
    assert rep.backward.detail["sanitizer"]["status"] == "not run"


def test_a_finding_in_a_template_device_function_keeps_its_name():
    # As on the H200 for planted_bwd_far_write: the frame is the inlined template function,
    # whose template argument has parentheses of its own (once cut to "void pb_main<").
    report = (REPORTS / "memcheck_oob.txt").read_text().replace(
        "at far_writer+0x1f0 in far_writer.cu:41",
        "at void pb_main<(int)0>(const FaParams &)+0x28f0 in /tmp/k/planted_bwd.cu:185")
    r = sanitize.parse("memcheck", report, {"planted_bwd.cu"})
    assert r.summary.startswith("memcheck: 2 errors: Invalid __global__ write of size 2 "
                                "bytes in void pb_main<(int)0>+0x28f0 at planted_bwd.cu:185")
