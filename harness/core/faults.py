"""Which errors leave a CUDA context unusable.

After an illegal address or a launch failure every later call in the same process fails
too, so the child process that saw one must report it as `crashed` and exit rather than go
on to the next case. Both the isolation layer and the peers (which turn a backend's
refusal into a skip, but never a fatal error) ask this one function.
"""

from __future__ import annotations

# Text of errors after which a CUDA context cannot be trusted any more.
CUDA_FATAL_MARKERS = (
    "illegal memory access",
    "illegal instruction",
    "unspecified launch failure",
    "misaligned address",
    "device-side assert",
    "cudaErrorIllegalAddress",
    "CUDA_ERROR_ILLEGAL",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_ASSERT",
    "an illegal",
    "launch timed out",
    "CUDA error: unknown error",
)


def is_cuda_fatal(text: str) -> bool:
    low = text.lower()
    return any(m.lower() in low for m in CUDA_FATAL_MARKERS)
