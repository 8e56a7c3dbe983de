"""The run-to-run noise of each (candidate, pass, case) on one GPU model, from history.

Within-run samples say how precisely one run measured its median; they say nothing of
how far the next run's median lands (another process, another clock, another L2 state).
On the committed H200 records fa1's median moved 0.0313 -> 0.0321 -> 0.0312 TFLOP/s
across unchanged commits while one run's samples called a +2.3% change certain
(p = 2e-77). So a timing verdict must also stand out against the spread of the stored
medians of earlier runs.

The spread: the medians of the last runs (at most `HISTORY_RUNS`) of the same candidate,
pass and case on the same GPU model, oldest first; the differences of consecutive log
medians are taken only between runs at the same source (the candidate's source hash: an
A/A pair, where the code did not change), and their robust scale is the spread (1.4826 x
their median absolute value, divided by sqrt 2: the difference of two independent draws
has sqrt 2 times their spread), so a step in the history does not inflate it. The spread
is the measurement's, not the code's: a commit that changes a kernel is judged against
the spread its earlier sources showed. With fewer than `MIN_PAIRS` such pairs the spread
is unknown and a verdict says "insufficient history" instead of claiming a run-to-run
noise it has not seen.

The threshold a timing change must pass (`threshold`): the comparison's practical one
(2%) while the history is short, raised to `NOISE_K` spreads where the runs are noisier;
with `TRUSTED_PAIRS` A/A pairs or more, `NOISE_K` spreads but at least `MIN_CHANGE` (1%,
the smallest change Chromium's perf dashboard alerts on): a quiet series is held to what
it can resolve, a 2% slowdown of a kernel measured to 0.3% is not waved through by a fixed
2% bar. `harness.records.compare` uses it per (candidate, pass, case), and `judge` turns a
change within the noise into "same", with the spread in its detail.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

MIN_HISTORY = 3  # medians, for relative_spread
MIN_PAIRS = 2  # A/A pairs, for a NoiseModel's spread
TRUSTED_PAIRS = 4
HISTORY_RUNS = 20
NOISE_K = 3.0
MIN_CHANGE = 0.01

Key = tuple[str, str, str]  # (candidate, pass, case id)


def _spread(diffs: Sequence[float]) -> float:
    return 1.4826 * statistics.median(diffs) / math.sqrt(2.0)


def _log(m: float | None) -> float | None:
    return math.log(m) if m is not None and m > 0 and math.isfinite(m) else None


def relative_spread(medians: Sequence[float]) -> float | None:
    """The run-to-run relative spread of a series of medians (oldest first, one source),
    or None when there are fewer than MIN_HISTORY usable ones."""
    xs = [x for m in medians if (x := _log(m)) is not None]
    if len(xs) < MIN_HISTORY:
        return None
    return _spread([abs(b - a) for a, b in zip(xs, xs[1:], strict=False)])


@dataclass
class NoiseModel:
    """(source hash, median) of earlier runs per (candidate, pass, case), oldest first."""

    points: dict[Key, list[tuple[str, float]]] = field(default_factory=dict)

    def add(self, key: Key, source: str, median: float) -> None:
        self.points.setdefault(key, []).append((source, median))

    def pairs(self, key: Key) -> list[float]:
        """|log ratio| of consecutive runs at the same source (A/A pairs)."""
        pts = [(src, x) for src, m in self.points.get(key, []) if (x := _log(m)) is not None]
        return [abs(b - a) for (sa, a), (sb, b) in zip(pts, pts[1:], strict=False)
                if sa == sb]

    def spread(self, key: Key) -> float | None:
        diffs = self.pairs(key)
        return _spread(diffs) if len(diffs) >= MIN_PAIRS else None

    def history(self, key: Key) -> int:
        return len(self.pairs(key))

    def threshold(self, key: Key, practical: float) -> float:
        """The smallest timing change that counts for `key` (module doc)."""
        spread, n = self.spread(key), self.history(key)
        if spread is None:
            return practical
        floor = MIN_CHANGE if n >= TRUSTED_PAIRS else practical
        return max(floor, math.expm1(NOISE_K * spread))


def judge(verdict: str, ratio: float | None, spread: float | None, n_history: int,
          detail: dict[str, Any], practical: float = 0.02) -> str:
    """The verdict once the run-to-run noise is known (module doc); notes in `detail`:
    the spread, and why a change beyond the `practical` threshold is still "same"."""
    if verdict not in ("regression", "improvement", "same", "inconclusive") or ratio is None:
        return verdict
    if spread is None:
        if verdict in ("regression", "improvement"):
            detail["history"] = (f"insufficient history ({n_history} A/A pair(s) of earlier "
                                 f"runs at one source, {MIN_PAIRS} needed): judged on this "
                                 "run's samples only")
        return verdict
    detail["run_to_run_spread"] = spread
    size = abs(math.log(ratio))
    timing_verdict = verdict in ("regression", "improvement")
    if size < NOISE_K * spread and (timing_verdict or abs(ratio - 1.0) > practical):
        detail["reason"] = (f"within the run-to-run noise: {abs(ratio - 1):.2%} change, "
                            f"runs spread {spread:.2%} ({NOISE_K:g} x = {NOISE_K * spread:.2%})")
        return "same"
    return verdict


def from_rows(rows: Iterable[tuple[str, str, str, str, float]]) -> NoiseModel:
    """A model from (candidate, source hash, pass, case id, median) rows, oldest first."""
    model = NoiseModel()
    for name, src, pass_name, case_id, median in rows:
        model.add((name, pass_name or "fwd", case_id), src or "", float(median))
    return model


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
            runs: int = HISTORY_RUNS) -> NoiseModel:
    """The model from the last `runs` stored runs on `gpu_model_key` before run
    `before_run_id` (its passed, timed results)."""
    rows = timed_history(db, gpu_model_key, upto_run_id=before_run_id, runs=runs,
                         include_upto=False)
    return from_rows([(n, src, p, c, m) for n, src, p, c, _commit, m in rows])
