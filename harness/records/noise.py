"""The run-to-run noise of each (candidate, pass, case) on one GPU model, from history.

Within-run samples say how precisely one run measured its median; they say nothing of
how far the next run's median lands (another process, another clock, another L2 state).
On the committed H200 records fa1's median moved 0.0313 -> 0.0321 -> 0.0312 TFLOP/s
across unchanged commits while one run's samples called a +2.3% change certain
(p = 2e-77). So a timing verdict must also stand out against the spread of the stored
medians of earlier runs.

The spread: the medians of the last runs (at most `HISTORY_RUNS`) of the same candidate,
pass and case on the same GPU model, oldest first (counted per series among the last
`LOOKBACK_RUNS` stored runs of the model, so that runs which did not time a case do not
push its history out); the differences of consecutive log
medians are taken only between runs at the same source (the candidate's source hash: an
A/A pair, where the code did not change), and their robust scale is the spread (1.4826 x
their median absolute value, divided by sqrt 2: the difference of two independent draws
has sqrt 2 times their spread), so a step in the history does not inflate it. The spread
is the measurement's, not the code's: a commit that changes a kernel is judged against
the spread its earlier sources showed. With fewer than `MIN_PAIRS` such pairs the spread
is unknown and a verdict says "insufficient history" instead of claiming a run-to-run
noise it has not seen; such a change counts only beyond `NO_HISTORY_CHANGE` (5%): the
first commits of a new runner's history shifted 2-4% as a run in the noisier band of the
committed records (bench/gate_verdicts.py, docs/regressions.md), while the largest
residual of one chip's runs there is 1.7%, so a fixed 2% bar there turned 3-4% of the
no-op commits of every new history red.

Each GPU apart. A fleet's runners are different chips of one model, and chips differ:
on the committed H200 records (almost every run on a chip of its own) fa1 on a 1k-key
decode case measures 0.522 ms on some chips and 0.537-0.541 on others, flex_attention's
d64 causal case 0.49 or 0.65 ms, while five runs on one chip agree within 0.3%. A spread
pooled over both kinds of pairs is the one chip's (a robust scale ignores the rarer
cross-chip pairs), and a run on another chip than its baseline's then reads as a 3%
regression of code that did not change. So each A/A pair is of one chip (both runs'
GPU uuid known and equal) or across chips, and a comparison uses the pairs of its own
kind (`across`: whether the new run's GPU differs from its baseline runs'): within one
chip its chip pairs (all pairs while those are fewer than `MIN_PAIRS`), across chips
the cross-chip pairs only (fewer than `MIN_PAIRS`: "insufficient history").
A source also has a range: `seen_range` is the span of the medians the same source
measured in the history on at least two chips; a timing change whose new median lies in
that span (widened by `NOISE_K` spreads) is code that did not change measuring what it
measured before on another chip, so "same" (`judge`'s `seen`).

The threshold a timing change must pass (`threshold`): `NO_HISTORY_CHANGE` with no
spread yet; the comparison's practical one (2%) while the history is short, raised to `NOISE_K` spreads where the runs are noisier;
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
LOOKBACK_RUNS = 120  # stored runs on the GPU model that timed_history reads at most
NOISE_K = 3.0
NO_HISTORY_CHANGE = 0.05  # the bar of a timing change while its spread is unknown
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
    """(source hash, median, GPU uuid) of earlier runs per (candidate, pass, case),
    oldest first ("" where the GPU uuid is unknown)."""

    points: dict[Key, list[tuple[str, float, str]]] = field(default_factory=dict)
    # The run each point came from (a database id; None where unknown), beside `points`:
    # what groups a candidate's cases into runs (harness.records.verdict_stats).
    runs: dict[Key, list[Any]] = field(default_factory=dict)

    def add(self, key: Key, source: str, median: float, device: str = "",
            run: Any = None) -> None:
        self.points.setdefault(key, []).append((source, median, device or ""))
        self.runs.setdefault(key, []).append(run)

    def pairs(self, key: Key, across: bool | None = None) -> list[float]:
        """|log ratio| of consecutive runs at the same source (A/A pairs): all of them
        (`across` None), those on one chip (False) or across chips (True); a pair with
        an unknown GPU is neither."""
        pts = [(src, x, dev) for src, m, dev in self.points.get(key, [])
               if (x := _log(m)) is not None]
        out = []
        for (sa, a, da), (sb, b, db) in zip(pts, pts[1:], strict=False):
            if sa != sb:
                continue
            if across is None or (da and db and (da != db) == across):
                out.append(abs(b - a))
        return out

    def used(self, key: Key, across: bool | None) -> list[float]:
        """The pairs a comparison of kind `across` is judged by (module doc)."""
        if across is False:
            own = self.pairs(key, False)
            return own if len(own) >= MIN_PAIRS else self.pairs(key)
        return self.pairs(key, across)

    def spread(self, key: Key, across: bool | None = None) -> float | None:
        diffs = self.used(key, across)
        return _spread(diffs) if len(diffs) >= MIN_PAIRS else None

    def history(self, key: Key, across: bool | None = None) -> int:
        return len(self.used(key, across))

    def threshold(self, key: Key, practical: float, across: bool | None = None) -> float:
        """The smallest timing change that counts for `key` (module doc)."""
        spread, n = self.spread(key, across), self.history(key, across)
        if spread is None:
            return max(practical, NO_HISTORY_CHANGE)
        floor = MIN_CHANGE if n >= TRUSTED_PAIRS else practical
        return max(floor, math.expm1(NOISE_K * spread))

    def seen_range(self, key: Key, source: str) -> tuple[float, float] | None:
        """(lowest, highest) median of `source` in the history when it was measured on
        at least two chips, MIN_HISTORY runs or more (module doc); else None."""
        meds = [(m, dev) for src, m, dev in self.points.get(key, [])
                if src == source and _log(m) is not None]
        if not source or len(meds) < MIN_HISTORY or len({d for _, d in meds if d}) < 2:
            return None
        return min(m for m, _ in meds), max(m for m, _ in meds)


def judge(verdict: str, ratio: float | None, spread: float | None, n_history: int,
          detail: dict[str, Any], practical: float = 0.02, *,
          seen: tuple[float, float] | None = None, new_median: float | None = None,
          across: bool | None = None) -> str:
    """The verdict once the run-to-run noise is known (module doc); notes in `detail`:
    the spread, and why a change beyond the `practical` threshold is still "same".
    `seen`: the range the new entry's source measured before (`seen_range`), with the
    new median; `across`: the new run is on another chip than its baseline's."""
    if verdict not in ("regression", "improvement", "same", "inconclusive") or ratio is None:
        return verdict
    timing_verdict = verdict in ("regression", "improvement")
    if seen is not None and new_median is not None and timing_verdict:
        widen = math.exp(NOISE_K * (spread or 0.0))
        lo, hi = seen
        if lo / widen <= new_median <= hi * widen:
            detail["seen_range_ms"] = [lo, hi]
            detail["reason"] = (f"within what this source measured before on GPUs of this "
                                f"model ({lo:.4g}-{hi:.4g} ms): the code did not change")
            return "same"
    if spread is None:
        if timing_verdict:
            kind = " across GPUs" if across else ""
            detail["history"] = (f"insufficient history ({n_history} A/A pair(s) of earlier "
                                 f"runs at one source{kind}, {MIN_PAIRS} needed): judged on "
                                 f"this run's samples only, beyond {NO_HISTORY_CHANGE:.0%}")
        return verdict
    detail["run_to_run_spread"] = spread
    if across is not None:
        detail["spread_of"] = "runs across GPUs" if across else "runs on one GPU"
    size = abs(math.log(ratio))
    if size < NOISE_K * spread and (timing_verdict or abs(ratio - 1.0) > practical):
        detail["reason"] = (f"within the run-to-run noise: {abs(ratio - 1):.2%} change, "
                            f"runs spread {spread:.2%} ({NOISE_K:g} x = {NOISE_K * spread:.2%})")
        return "same"
    return verdict


def whole_candidate_only(verdicts: Sequence[Any], across_of: Any) -> None:
    """Across chips with no run-to-run history, a case's timing flag stands only where its
    candidate moved as a whole: the median ratio of the candidate's other timed cases in
    this comparison is past the same bar in the same direction; else "inconclusive" (a
    candidate timed on one case keeps its flag: nothing to tell it by). The chips
    of one model move single cases by far more than any bar (2% of the committed H200
    history's per-case residuals across chips lie beyond 5%, the largest at 50%), a whole
    candidate by at most 4.7%: one case alone across chips is a chip, not a commit.
    `verdicts`: harness.records.compare.Verdict, changed in place; `across_of(key)`:
    whether that comparison crosses chips."""
    ratios: dict[tuple[str, str], dict[str, float]] = {}
    for v in verdicts:
        if v.ratio and v.ratio > 0 and v.verdict in ("regression", "improvement", "same",
                                                      "inconclusive"):
            ratios.setdefault((v.variant, v.pass_name), {})[v.case_id] = math.log(v.ratio)
    for v in verdicts:
        if v.verdict not in ("regression", "improvement") or "history" not in v.detail or \
                across_of((v.variant, v.pass_name, v.case_id)) is not True:
            continue
        others = [x for c, x in ratios.get((v.variant, v.pass_name), {}).items()
                  if c != v.case_id]
        if not others:
            continue
        mid = statistics.median(others)
        bar = math.log1p(float(v.detail.get("threshold", NO_HISTORY_CHANGE)))
        if (mid if v.verdict == "regression" else -mid) < bar:
            v.detail["reason"] = (f"across GPUs with no run-to-run history: {v.ratio - 1:+.2%}"
                                  f" of this case while its candidate's median case moved "
                                  f"{math.expm1(mid):+.2%} (a chip moves single cases)")
            v.verdict = "inconclusive"


def from_rows(rows: Iterable[tuple]) -> NoiseModel:
    """A model from (candidate, source hash, pass, case id, median[, GPU uuid[, run]])
    rows, oldest first."""
    model = NoiseModel()
    for name, src, pass_name, case_id, median, *rest in rows:
        model.add((name, pass_name or "fwd", case_id), src or "", float(median),
                  (rest[0] if rest else "") or "", rest[1] if len(rest) > 1 else None)
    return model


def timed_history(db: Any, gpu_model_key: str | None, *, upto_run_id: int | None, runs: int,
                  include_upto: bool, kernels: Sequence[str] | None = None,
                  lookback: int = LOOKBACK_RUNS, trusted_only: bool = True,
                  mean_of_runs: bool = False) -> list[tuple]:
    """(candidate, source hash, pass, case id, commit, median, GPU uuid, run id) of the passed, timed
    results on `gpu_model_key` up to run `upto_run_id` (itself included or not), oldest
    first, the last `runs` of each (candidate, pass, case): what the noise model and the
    step search (harness.records.steps) read. Counted per series, not per stored run: a
    database that also holds perf or backward runs, which do not time the gate's decode
    cases, must not push those cases' history out of the window. Only the last
    `lookback` runs on the GPU model are read, which bounds the query. Only trusted runs
    (`trusted_only`, migration 0007) are history; run `upto_run_id` itself is read
    whatever its origin when it is included. `upto_run_id` None: every stored run (a run
    not stored yet, harness.records.confirm, is newer than all of them). `mean_of_runs`:
    a result's median is the geometric mean of its own and its confirmation runs'
    (`confirm_ms`), as the step search reads a commit; the noise model reads one run's
    median (the spread it estimates is one run's)."""
    from sqlalchemy import func, or_, select

    from harness.records.db.models import CaseRow, Result, Run, Variant

    cond = [Run.gpu_model_key == gpu_model_key]
    if upto_run_id is not None:
        when = select(Run.created_at).where(Run.id == upto_run_id).scalar_subquery()
        cond.append(Run.created_at <= when)
    if not include_upto and upto_run_id is not None:
        cond.append(Run.id != upto_run_id)
    if trusted_only:
        cond.append(or_(Run.trusted.is_(True), Run.id == upto_run_id) if include_upto
                    else Run.trusted.is_(True))
    recent = (select(Run.id).where(*cond)
              .order_by(Run.created_at.desc(), Run.id.desc()).limit(lookback).subquery())
    newest_first = func.row_number().over(
        partition_by=(Variant.name, Result.pass_name, Result.case_pk),
        order_by=(Run.created_at.desc(), Run.id.desc()))
    rows = (select(Variant.name, Variant.source_hash, Result.pass_name, CaseRow.case_id,
                   Run.commit, Result.median_ms, Run.gpu_uuid,
                   Run.created_at.label("at"), Run.id.label("run"),
                   newest_first.label("nth"),
                   *([Result.extra.label("extra")] if mean_of_runs else []))
            .select_from(Result)
            .join(Variant, Variant.id == Result.variant_id)
            .join(CaseRow, CaseRow.id == Result.case_pk)
            .join(Run, Run.id == Result.run_id)
            .where(Result.run_id.in_(select(recent.c.id)), Result.status == "passed",
                   Result.median_ms.is_not(None)))
    if kernels is not None:
        rows = rows.where(Variant.name.in_(list(kernels)))
    r = rows.subquery()
    stmt = (select(r.c.name, r.c.source_hash, r.c.pass_name, r.c.case_id, r.c.commit,
                   r.c.median_ms, r.c.gpu_uuid, r.c.run,
                   *([r.c.extra] if mean_of_runs else []))
            .where(r.c.nth <= runs).order_by(r.c.at, r.c.run))
    with db.session() as s:
        got = [tuple(row) for row in s.execute(stmt).all()]
    if not mean_of_runs:
        return got
    return [(*row[:5], mean_of_runs_ms(row[5], row[8]), *row[6:8]) for row in got]


def mean_of_runs_ms(median: float, extra: Any) -> float:
    """The geometric mean of a result's median and its confirmation runs' medians
    (`confirm_ms`, kept in the stored result's extra["_record"])."""
    more = ((extra or {}).get("_record") or {}).get("confirm_ms") if isinstance(extra, dict) \
        else None
    logs = [math.log(float(median))]
    for m in more if isinstance(more, list) else []:
        try:
            x = float(m)
        except (TypeError, ValueError):
            continue
        if x > 0 and math.isfinite(x):
            logs.append(math.log(x))
    return math.exp(sum(logs) / len(logs))


def from_db(db: Any, gpu_model_key: str | None, *, before_run_id: int | None,
            runs: int = HISTORY_RUNS) -> NoiseModel:
    """The model from the passed, timed results of the stored runs on `gpu_model_key`
    before run `before_run_id` (None: all of them): the last `runs` of each (candidate,
    pass, case)."""
    rows = timed_history(db, gpu_model_key, upto_run_id=before_run_id, runs=runs,
                         include_upto=False)
    return from_rows([(n, src, p, c, m, dev, run) for n, src, p, c, _commit, m, dev, run in rows])
