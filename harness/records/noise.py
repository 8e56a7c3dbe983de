"""The run-to-run noise of each (candidate, pass, case) on one GPU model, from history.

Within-run samples say how precisely one run measured its median; they say nothing of
how far the next run's median lands (another process, another clock, another L2 state).
On the committed H200 records fa1's median moved 0.0313 -> 0.0321 -> 0.0312 TFLOP/s
across unchanged commits while one run's samples called a +2.3% change certain
(p = 2e-77). So a timing verdict must also stand out against the spread of the stored
medians of earlier runs.

The spread: the medians of the last runs (at most `HISTORY_RUNS`) of the same candidate
at the same source (its source hash: the A/A history, where the code did not change),
pass and case on the same GPU model; the robust scale of the differences of consecutive
log medians (1.4826 x their median absolute value, divided by sqrt 2: the differences of
two independent draws have sqrt 2 times their spread), so a step in the history does not
inflate it. With fewer than `MIN_HISTORY` medians the spread is unknown and a verdict
says "insufficient history" instead of claiming a run-to-run noise it has not seen.

`harness.records.compare` turns a regression or improvement whose size is within
`NOISE_K` spreads into "same", with the spread in its detail.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

MIN_HISTORY = 3
HISTORY_RUNS = 20
NOISE_K = 3.0

Key = tuple[str, str, str]  # (candidate, pass, case id)


def relative_spread(medians: Sequence[float]) -> float | None:
    """The run-to-run relative spread of a series of medians (oldest first), or None
    when there are fewer than MIN_HISTORY usable ones."""
    xs = [math.log(m) for m in medians if m is not None and m > 0 and math.isfinite(m)]
    if len(xs) < MIN_HISTORY:
        return None
    diffs = [abs(b - a) for a, b in zip(xs, xs[1:], strict=False)]
    return 1.4826 * statistics.median(diffs) / math.sqrt(2.0)


@dataclass
class NoiseModel:
    """Medians of earlier runs per (candidate, pass, case), oldest first."""

    medians: dict[Key, list[float]] = field(default_factory=dict)

    def add(self, key: Key, median: float) -> None:
        self.medians.setdefault(key, []).append(median)

    def spread(self, key: Key) -> float | None:
        return relative_spread(self.medians.get(key, []))

    def history(self, key: Key) -> int:
        return len(self.medians.get(key, []))


def judge(verdict: str, ratio: float | None, spread: float | None, n_history: int,
          detail: dict[str, Any]) -> str:
    """The verdict once the run-to-run noise is known (module doc); notes in `detail`."""
    if verdict not in ("regression", "improvement") or ratio is None:
        return verdict
    if spread is None:
        detail["history"] = (f"insufficient history ({n_history} earlier run(s), "
                             f"{MIN_HISTORY} needed): judged on this run's samples only")
        return verdict
    detail["run_to_run_spread"] = spread
    size = abs(math.log(ratio))
    if size < NOISE_K * spread:
        detail["reason"] = (f"within the run-to-run noise: {abs(ratio - 1):.2%} change, "
                            f"runs spread {spread:.2%} ({NOISE_K:g} x = {NOISE_K * spread:.2%})")
        return "same"
    return verdict


def from_rows(rows: Iterable[tuple[str, str, str, str, float]],
              source_hashes: dict[str, str]) -> NoiseModel:
    """A model from (candidate, source hash, pass, case id, median) rows, oldest first;
    rows of another source than `source_hashes[candidate]` (when given) are not A/A."""
    model = NoiseModel()
    for name, src, pass_name, case_id, median in rows:
        want = source_hashes.get(name)
        if want and src and src != want:
            continue
        model.add((name, pass_name or "fwd", case_id), float(median))
    return model


def source_hashes(record: Any) -> dict[str, str]:
    """Candidate -> source hash of a run record (its `kernels` section)."""
    return {k: str(v.get("source_hash") or "") for k, v in (record.kernels or {}).items()}


def timed_history(db: Any, gpu_model_key: str | None, *, upto_run_id: int, runs: int,
                  include_upto: bool, kernels: Sequence[str] | None = None) -> list[tuple]:
    """(candidate, source hash, pass, case id, commit, median) of the passed, timed
    results of the last `runs` stored runs on `gpu_model_key` up to run `upto_run_id`
    (itself included or not), oldest first: what the noise model and the step search
    (harness.records.steps) read."""
    from sqlalchemy import select

    from harness.records.db.models import CaseRow, Result, Run, Variant

    when = select(Run.created_at).where(Run.id == upto_run_id).scalar_subquery()
    cond = [Run.gpu_model_key == gpu_model_key, Run.created_at <= when]
    if not include_upto:
        cond.append(Run.id != upto_run_id)
    recent = (select(Run.id).where(*cond)
              .order_by(Run.created_at.desc(), Run.id.desc()).limit(runs).subquery())
    stmt = (select(Variant.name, Variant.source_hash, Result.pass_name, CaseRow.case_id,
                   Run.commit, Result.median_ms)
            .select_from(Result)
            .join(Variant, Variant.id == Result.variant_id)
            .join(CaseRow, CaseRow.id == Result.case_pk)
            .join(Run, Run.id == Result.run_id)
            .where(Result.run_id.in_(select(recent.c.id)), Result.status == "passed",
                   Result.median_ms.is_not(None))
            .order_by(Run.created_at, Run.id))
    if kernels is not None:
        stmt = stmt.where(Variant.name.in_(list(kernels)))
    with db.session() as s:
        return [tuple(r) for r in s.execute(stmt).all()]


def from_db(db: Any, gpu_model_key: str | None, *, before_run_id: int,
            source_hashes: dict[str, str], runs: int = HISTORY_RUNS) -> NoiseModel:
    """The model from the last `runs` stored runs on `gpu_model_key` before run
    `before_run_id` (its passed, timed results)."""
    rows = timed_history(db, gpu_model_key, upto_run_id=before_run_id, runs=runs,
                         include_upto=False)
    return from_rows([(n, src, p, c, m) for n, src, p, c, _commit, m in rows], source_hashes)
