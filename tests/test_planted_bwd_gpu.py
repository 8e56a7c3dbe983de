"""The planted CUDA backwards of tests/data/planted_bwd on a GPU: the plain backward passes
its check, the one right only on its first call per case fails on its repeat, and
compute-sanitizer on the backward finds the write 3 MiB past dK (GPU only; the command
lines without a GPU: tests/test_sanitize_backward.py; end to end through `fa-harness ci`
and the submission scorer: bench/h200_backward_planted.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.candidates.cuda_candidate import CudaVariant
from harness.candidates.variants import load_variant
from harness.core.cases import Case, MaskKind
from harness.core.check_grad import check_backward_case
from harness.core.results import Status

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

PLANTED = Path(__file__).parent / "data" / "planted_bwd" / "planted_bwd"
CASES = [Case(2, 4, 2, 113, 203, 64, "float16", MaskKind.CAUSAL_BR),
         Case(1, 2, 2, 64, 96, 128, "bfloat16", MaskKind.RANDOM)]


def _variant(name: str) -> CudaVariant:
    return CudaVariant.from_spec(load_variant(str(PLANTED), name))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_plain_backward_passes_and_the_first_call_plant_fails_its_repeat(case):
    ok = check_backward_case(_variant("planted_bwd"), case, device="cuda", repeats=2)
    assert ok.status is Status.PASSED, ok.message
    bad = check_backward_case(_variant("planted_bwd_first_call"), case, device="cuda")
    assert bad.status is Status.FAILED, bad.message
    assert bad.message.startswith("repeat 1 (call 2 of 2; the first passed): dq:")


def test_the_sanitizer_finds_the_write_past_dk():
    from harness.execution.sanitize import sanitize_variants, sanitizer_path

    if sanitizer_path() is None:
        pytest.skip("compute-sanitizer not installed")
    out = {o.name: o for o in sanitize_variants([_variant("planted_bwd"),
                                                 _variant("planted_bwd_far_write")],
                                                tier="fast", trusted=True)}
    assert not out["planted_bwd"].failed, out["planted_bwd"].line
    assert "forward and backward" in out["planted_bwd"].line
    bad = out["planted_bwd_far_write"]
    assert bad.failed and "Invalid __global__ write" in bad.line, bad.line
    # the frame: the backward's main pass, pb_main<...> inlined in planted_bwd_main_*
    assert " in void pb_main<" in bad.line and "at planted_bwd.cu:" in bad.line, bad.line
