"""Shared fixtures of the project's own tests."""

from __future__ import annotations

import pytest
from fake_candidates import make_fake


@pytest.fixture
def fake():
    """make_fake(bug="none", **fields) -> FakeCandidate (see tests/fake_candidates.py)."""
    return make_fake
