"""What the project's Triton forward (triton_fa2) and backward (triton_fa2_bwd) share."""

from __future__ import annotations

import os

MAX_HEAD_DIM = 256


def interpret() -> bool:
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"
