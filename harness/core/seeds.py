"""Seeds of a case's draws, from the case id (and a secret for scored submissions)."""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(case: Any, secret: int = 0, draw: int = 0) -> int:
    """A 63-bit seed from the case, a secret (0 for public runs) and a draw index.

    Hashing (not adding) keeps a submission from predicting the inputs of one draw from
    another, and keeps different cases with the same `seed` field independent."""
    h = hashlib.blake2b(digest_size=8)
    h.update(case.id.encode())
    h.update(int(secret).to_bytes(16, "little", signed=False))
    h.update(int(draw).to_bytes(8, "little", signed=False))
    return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)
