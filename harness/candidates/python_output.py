"""What a Python candidate returns, checked and placed (harness.candidates.python_candidate):
a result of the wrong type, shape, dtype or device is `CandidateOutputError` naming what
was expected, and a varlen result's sequence rows are the only ones copied."""

from __future__ import annotations

from typing import Any

import torch

from harness.core.cases import Inputs


class CandidateOutputError(RuntimeError):
    """A Python candidate returned something other than what the protocol asks for."""


def sequence_rows(inputs: Inputs) -> torch.Tensor:
    """int64 indices of the packed rows that belong to a sequence of a varlen case (its
    `serving` index: slot starts cu_seqlens_q, lengths seqlens_q)."""
    index = inputs.serving
    starts = index.cu_seqlens_q[:-1].long()
    lens = index.seqlens_q.long()
    first = torch.repeat_interleave(starts, lens)  # each row's sequence start
    into = torch.arange(int(lens.sum()), device=lens.device) - torch.repeat_interleave(
        torch.cumsum(lens, 0) - lens, lens)  # each row's position in its sequence
    return (first + into).to(inputs.q.device)


def expect_tensor(t: Any, what: str, like: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise CandidateOutputError(f"{what} is {type(t).__name__}, expected a torch.Tensor")
    if tuple(t.shape) != tuple(like.shape):
        raise CandidateOutputError(f"{what} has shape {tuple(t.shape)}, expected "
                                   f"{tuple(like.shape)}")
    if t.dtype != like.dtype:
        raise CandidateOutputError(f"{what} has dtype {t.dtype}, expected {like.dtype}")
    if t.device != like.device:
        raise CandidateOutputError(f"{what} is on {t.device}, expected {like.device}")
