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

The backward's gradients dQ, dK and dV are judged by the same rule (`check_grads`), each
against the same-precision naive backward's error with the backward's factor, 3
(FlashAttention's own backward tests allow 3x where the forward allows 2x: the chain rule
compounds the forward's rounding), and a fully masked row's dQ must be exactly 0.
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
BWD_FACTOR = 3.0
GRAD_NAMES = ("dq", "dk", "dv")
# LSE is float32 in every candidate: allow a few float32 ulps of the LSE's magnitude on
# top of an absolute 1e-5, so that a candidate more exact than the naive one never fails.
LSE_ABS_FLOOR = 1e-5
LSE_REL_FLOOR = 8 * torch.finfo(torch.float32).eps


@dataclass
class Verdict:
    passed: bool
    message: str
    errors: Errors = field(default_factory=Errors)
    # Per-tensor errors of a backward check: {"dq": {"err", "base_err", "floor", "ratio"},
    # ..., "factor": 3.0}; recorded with the result.
    detail: dict = field(default_factory=dict)


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

    out_err, ratio, worst, found = judge_tensor("out", out, ref_out, baseline.out_err,
                                                baseline.floor, OUT_FACTOR, masked_rows)
    problems += found
    base_err, floor = baseline.out_err, baseline.floor
    errors.out_err, errors.base_err, errors.floor, errors.ratio = out_err, base_err, floor, ratio
    errors.worst_index = worst

    if writes_lse:
        problems += _check_lse(lse, ref_lse, baseline.lse_err, masked_rows, masked_lse, errors)

    if problems:
        return Verdict(False, "; ".join(problems), errors)
    return Verdict(True, f"max error {out_err:.3e} <= {OUT_FACTOR:g} x {base_err:.3e} + "
                         f"{floor:.3e} (ratio {errors.ratio:.2f})", errors)


def judge_tensor(name: str, got: torch.Tensor, ref: torch.Tensor, base_err: float,
                 floor: float, factor: float, masked_rows: torch.Tensor | None = None,
                 ) -> tuple[float, float, list[int] | None, list[str]]:
    """The rule on one tensor: no NaN/Inf, rows of `masked_rows` (a boolean over all but
    the last dimension) exactly 0, and max |got - ref| <= factor x `base_err` + `floor`.
    Returns (max error, ratio to the naive error, worst index, problems)."""
    problems: list[str] = []
    worst: list[int] | None = None
    finite = torch.isfinite(got)
    if not bool(finite.all()):
        bad = ~finite
        first = _index(int(bad.flatten().nonzero()[0]), got.shape)
        val = float(got[tuple(first)])
        problems.append(f"{name}: {int(bad.sum())} non-finite element(s), first {val} at "
                        f"{_fmt_index(first)}")
        worst = first
    if masked_rows is not None and bool(masked_rows.any()):
        nonzero = (got != 0) & masked_rows[..., None]
        if bool(nonzero.any()):
            first = _index(int(nonzero.flatten().nonzero()[0]), got.shape)
            problems.append(f"{name}: fully masked row not exactly 0: {int(nonzero.sum())} "
                            f"element(s), first {float(got[tuple(first)])!r} at "
                            f"{_fmt_index(first)}")
            worst = worst or first
    diff = (got.double() - ref).abs_()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    err = float(diff.max()) if diff.numel() else 0.0
    ratio = _ratio(err, base_err, floor)
    if finite.all() and err > factor * base_err + floor:
        worst = _index(int(diff.flatten().argmax()), got.shape)
        problems.append(
            f"{name}: max error {err:.3e} at {_fmt_index(worst)} (got "
            f"{float(got[tuple(worst)]):.6g}, expected {float(ref[tuple(worst)]):.6g}) "
            f"exceeds {factor:g} x naive error {base_err:.3e} + floor {floor:.3e} "
            f"(ratio {ratio:.2f})")
    return err, ratio, worst, problems


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


@dataclass(frozen=True)
class GradBaseline:
    """What the rule measures a backward against, once per case: the naive backward's
    error and the data floor of each gradient, and the fully masked query rows."""

    base_err: tuple[float, float, float]
    floor: tuple[float, float, float]
    masked_rows: torch.Tensor

    @classmethod
    def compute(cls, ref: tuple[torch.Tensor, ...], base: tuple[torch.Tensor, ...],
                dtype: torch.dtype, masked_rows: torch.Tensor) -> GradBaseline:
        errs = tuple(float((b.double() - r).abs_().max()) if r.numel() else 0.0
                     for r, b in zip(ref, base, strict=True))
        floors = tuple(data_floor(r, dtype) for r in ref)
        return cls(errs, floors, masked_rows)  # type: ignore[arg-type]


def check_grads(grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                ref: tuple[torch.Tensor, ...], baseline: GradBaseline, *,
                factor: float = BWD_FACTOR) -> Verdict:
    """Judge a backward's (dq, dk, dv) against the float64 oracle's with `judge_tensor`
    (the module doc). `errors.ratio` is the worst of the three ratios, `detail` has each."""
    errors = Errors()
    detail: dict = {"factor": factor}
    problems: list[str] = []
    worst_ratio, worst_name = -1.0, ""
    for i, (name, got, want) in enumerate(zip(GRAD_NAMES, grads, ref, strict=True)):
        if tuple(got.shape) != tuple(want.shape):
            problems.append(f"{name}: shape {tuple(got.shape)} != expected "
                            f"{tuple(want.shape)}")
            continue
        want = want.to(got.device)
        masked = baseline.masked_rows.to(got.device) if name == "dq" else None
        err, ratio, worst, found = judge_tensor(name, got, want, baseline.base_err[i],
                                                baseline.floor[i], factor, masked)
        detail[name] = {"err": err, "base_err": baseline.base_err[i],
                        "floor": baseline.floor[i], "ratio": ratio}
        problems += found
        if ratio > worst_ratio:
            worst_ratio, worst_name = ratio, name
            errors.out_err, errors.base_err = err, baseline.base_err[i]
            errors.floor, errors.ratio = baseline.floor[i], ratio
        if found and errors.worst_index is None:
            errors.worst_index = worst
    if problems:
        return Verdict(False, "; ".join(problems), errors, detail)
    return Verdict(True, f"gradients within {factor:g} x naive error + floor (worst "
                         f"{worst_name}, ratio {worst_ratio:.2f})", errors, detail)
