"""The one tolerance rule every candidate is judged by.

A candidate's output passes when its error against the float64 oracle is at most twice
the error that the same-precision naive implementation makes against that oracle, plus a
floor derived from the data (FlashAttention's rule; FA3 derives the floor as
2 * max|(ref + 0.3 - 0.3) - ref| in the candidate dtype: the rounding a value near the
output's magnitude suffers). No per-test atol/rtol exists anywhere else in the project.

On top of the error bound, some outputs are wrong whatever their size:
- NaN or Inf anywhere in the output (the poison pattern is a NaN, so an unwritten element
  also lands here if the caller did not ask `OutputBuffers.unwritten` first);
- a fully masked row (no visible key) that is not exactly 0;
- an LSE that is not -inf (or +inf, for candidates declaring that convention) on a fully
  masked row, or is not finite elsewhere.
LSE error follows the same 2x-of-naive form, with a small floor for float32 rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

from harness.core.cases import Case
from harness.core.results import Errors

OUT_FACTOR = 2.0
LSE_FACTOR = 2.0
# LSE is float32 in every candidate: allow a few float32 ulps of the LSE's magnitude on
# top of an absolute 1e-5, so that a candidate more exact than the naive one never fails.
LSE_ABS_FLOOR = 1e-5
LSE_REL_FLOOR = 8 * torch.finfo(torch.float32).eps


@dataclass
class Verdict:
    passed: bool
    message: str
    errors: Errors = field(default_factory=Errors)


def _index(flat: int, shape: torch.Size) -> list[int]:
    return [int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape))]


def _fmt_index(idx: list[int]) -> str:
    names = "bhij"
    return "(" + ", ".join(f"{n}={i}" for n, i in zip(names, idx, strict=False)) + ")"


def data_floor(ref_out: torch.Tensor, dtype: torch.dtype) -> float:
    """FA3's data-derived floor: twice the rounding error of `ref + 0.3 - 0.3` in `dtype`."""
    r = ref_out.to(dtype)
    return 2.0 * float(((r + 0.3) - 0.3).double().sub_(ref_out).abs_().max()) if r.numel() else 0.0


@dataclass(frozen=True)
class Baseline:
    """What the rule measures a candidate against, computed once per case: the naive
    implementation's errors against the oracle and the data floor."""

    out_err: float
    floor: float
    lse_err: float
    masked_rows: torch.Tensor

    @classmethod
    def compute(cls, ref: tuple[torch.Tensor, torch.Tensor],
                base: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype) -> Baseline:
        ref_out, ref_lse = ref
        base_out, base_lse = base
        masked = torch.isneginf(ref_lse)  # (B, H, Nq): rows with no visible key
        out_err = (float((base_out.double() - ref_out).abs_().max()) if ref_out.numel()
                   else 0.0)
        live = ~masked
        lse_err = (float((base_lse.double() - ref_lse)[live].abs().max()) if bool(live.any())
                   else 0.0)
        return cls(out_err, data_floor(ref_out, dtype), lse_err, masked)


def _ratio(err: float, base: float, floor: float) -> float:
    if base > 0:
        return err / base
    if floor > 0:  # the naive implementation was exact here: measure in floor units
        return err / floor
    return 0.0 if err == 0 else math.inf


def check_output(case: Case, out: torch.Tensor, lse: torch.Tensor | None,
                 ref: tuple[torch.Tensor, torch.Tensor], base: tuple[torch.Tensor, torch.Tensor],
                 *, writes_lse: bool, masked_lse: Literal["-inf", "+inf"] = "-inf",
                 baseline: Baseline | None = None) -> Verdict:
    """Judge a candidate's `out` (and `lse`) against the oracle `ref` = (out, lse) float64
    and the same-precision naive `base` = (out, lse). See the module docstring.
    `baseline` (Baseline.compute of the same ref/base) saves recomputing it per candidate."""
    ref_out, ref_lse = ref
    errors = Errors()
    problems: list[str] = []
    if tuple(out.shape) != tuple(ref_out.shape):
        return Verdict(False, f"out: shape {tuple(out.shape)} != expected "
                              f"{tuple(ref_out.shape)}", errors)
    ref_out = ref_out.to(out.device)
    ref_lse = ref_lse.to(out.device)
    if baseline is None:
        baseline = Baseline.compute((ref_out, ref_lse),
                                    tuple(t.to(out.device) for t in base), out.dtype)
    masked_rows = baseline.masked_rows.to(out.device)

    finite = torch.isfinite(out)
    if not bool(finite.all()):
        bad = ~finite
        first = _index(int(bad.flatten().nonzero()[0]), out.shape)
        val = float(out[tuple(first)])
        problems.append(f"out: {int(bad.sum())} non-finite element(s), first {val} at "
                        f"{_fmt_index(first)}")
        errors.worst_index = first

    if bool(masked_rows.any()):
        nonzero = (out != 0) & masked_rows[..., None]
        if bool(nonzero.any()):
            first = _index(int(nonzero.flatten().nonzero()[0]), out.shape)
            problems.append(f"out: fully masked row not exactly 0: {int(nonzero.sum())} "
                            f"element(s), first {float(out[tuple(first)])!r} at "
                            f"{_fmt_index(first)}")
            errors.worst_index = errors.worst_index or first

    diff = (out.double() - ref_out).abs_()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    base_err, floor = baseline.out_err, baseline.floor
    out_err = float(diff.max()) if diff.numel() else 0.0
    errors.out_err, errors.base_err, errors.floor = out_err, base_err, floor
    errors.ratio = _ratio(out_err, base_err, floor)
    bound = OUT_FACTOR * base_err + floor
    if finite.all() and out_err > bound:
        worst = _index(int(diff.flatten().argmax()), out.shape)
        errors.worst_index = worst
        problems.append(
            f"out: max error {out_err:.3e} at {_fmt_index(worst)} (got "
            f"{float(out[tuple(worst)]):.6g}, expected {float(ref_out[tuple(worst)]):.6g}) "
            f"exceeds {OUT_FACTOR:g} x naive error {base_err:.3e} + floor {floor:.3e} "
            f"(ratio {errors.ratio:.2f})")

    if writes_lse:
        problems += _check_lse(lse, ref_lse, baseline.lse_err, masked_rows, masked_lse, errors)

    if problems:
        return Verdict(False, "; ".join(problems), errors)
    return Verdict(True, f"max error {out_err:.3e} <= {OUT_FACTOR:g} x {base_err:.3e} + "
                         f"{floor:.3e} (ratio {errors.ratio:.2f})", errors)


def _check_lse(lse: torch.Tensor | None, ref_lse: torch.Tensor, lse_base: float,
               masked_rows: torch.Tensor, masked_lse: str, errors: Errors) -> list[str]:
    if lse is None:
        return ["lse: the candidate declares it writes LSE but no LSE buffer was given"]
    if tuple(lse.shape) != tuple(ref_lse.shape):
        return [f"lse: shape {tuple(lse.shape)} != expected {tuple(ref_lse.shape)}"]
    problems = []
    lse64 = lse.double()
    expected_masked = math.inf if masked_lse == "+inf" else -math.inf
    if bool(masked_rows.any()):
        wrong = masked_rows & (lse64 != expected_masked)
        if bool(wrong.any()):
            first = _index(int(wrong.flatten().nonzero()[0]), lse.shape)
            problems.append(f"lse: fully masked row must be {masked_lse}, {int(wrong.sum())} "
                            f"row(s) differ, first {float(lse64[tuple(first)])!r} at "
                            f"{_fmt_index(first)}")
    live = ~masked_rows
    if not bool(live.any()):
        errors.lse_err, errors.lse_base_err = 0.0, 0.0
        return problems
    bad = live & ~torch.isfinite(lse64)
    if bool(bad.any()):
        first = _index(int(bad.flatten().nonzero()[0]), lse.shape)
        problems.append(f"lse: {int(bad.sum())} non-finite value(s) on rows with visible keys, "
                        f"first {float(lse64[tuple(first)])!r} at {_fmt_index(first)}")
    diff = torch.where(live, (lse64 - ref_lse).abs(), torch.zeros_like(ref_lse))
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    lse_err = float(diff.max())
    errors.lse_err, errors.lse_base_err = lse_err, lse_base
    floor = LSE_ABS_FLOOR + LSE_REL_FLOOR * float(ref_lse[live].abs().max())
    if not bad.any() and lse_err > LSE_FACTOR * lse_base + floor:
        worst = _index(int(diff.flatten().argmax()), lse.shape)
        problems.append(f"lse: max error {lse_err:.3e} at {_fmt_index(worst)} (got "
                        f"{float(lse64[tuple(worst)]):.6g}, expected "
                        f"{float(ref_lse[tuple(worst)]):.6g}) exceeds {LSE_FACTOR:g} x naive "
                        f"error {lse_base:.3e} + floor {floor:.3e}")
    return problems
