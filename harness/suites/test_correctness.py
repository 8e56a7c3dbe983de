"""Correctness of every selected candidate on every case of the grid, against the float64
oracle, under the one tolerance rule (harness.core.tolerance) and the buffer checks
(harness.core.buffers). Run: pytest suites --fa-grid smoke --fa-kernels 'fa2*'."""

from __future__ import annotations

import pytest

from harness.core.results import Status


def test_correctness(fa_candidate, fa_case, fa_check):
    res = fa_check(fa_candidate, fa_case)
    if res.status is Status.SKIPPED:
        pytest.skip(res.message)
    if res.status is not Status.PASSED:
        pytest.fail(f"{res.status.value}: {res.message}", pytrace=False)
