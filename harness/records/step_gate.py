"""The step search at the gate: which steps of a commit's history its run confirms, and
how they turn its verdicts (harness.records.steps has the search itself).

A step is a regression once `CONFIRM_POINTS` commits hold the new level (more where its
points ran on several chips, and enough of them to stand clear of their noise), while its
first bad commit is at most `CONFIRM_WINDOW` commits old; it is red once, at the commit
whose run first flagged it (`unreported`), and its alert stays open
(harness.records.alerts).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from harness.records.noise import timed_history
from harness.records.steps import (
    ALL_CASES,
    MIN_POINTS,
    SERIES_RUNS,
    WINDOW,
    Series,
    Sources,
    Step,
    candidate_series,
    find_steps,
    source_changes,
)

CONFIRM_POINTS = 2  # a step is a regression once two commits hold the new level ...
CONFIRM_WINDOW = 4  # ... and the gate reports it while its first bad commit is this recent

def history_from_db(db: Any, gpu_model_key: str | None, *, upto_run_id: int,
                    kernels: Sequence[str], runs: int = SERIES_RUNS
                    ) -> tuple[Series, Sources]:
    """(candidate, pass, case) -> [(commit, median)], oldest first: the last `runs`
    timed results of each series on `gpu_model_key` up to and including run
    `upto_run_id` (harness.records.noise.timed_history), one median per commit (its
    newest run's), passed timed results of `kernels` only; and (candidate,
    pass) -> {commit: source hash} of the same runs ("" where a record carries none)."""
    series, sources, _chips = history_with_chips(db, gpu_model_key, upto_run_id=upto_run_id,
                                                 kernels=kernels, runs=runs)
    return series, sources


def history_with_chips(db: Any, gpu_model_key: str | None, *, upto_run_id: int | None,
                       kernels: Sequence[str], runs: int = SERIES_RUNS
                       ) -> tuple[Series, Sources, Sources]:
    """`history_from_db`, and (candidate, pass) -> {commit: GPU uuid} of the same runs
    ("" where unknown): which chip each point ran on (`confirmed_steps`). A commit's
    point is the geometric mean of its run's median and its confirmation runs'
    (harness.records.confirm). `upto_run_id` None: every stored run."""
    rows = timed_history(db, gpu_model_key, upto_run_id=upto_run_id, runs=runs,
                         include_upto=True, kernels=kernels, mean_of_runs=True)
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    sources: Sources = {}
    chips: Sources = {}
    for name, src, pass_name, case_id, commit, median, device, *_ in rows:
        if commit is not None:
            per_commit = out.setdefault((name, pass_name or "fwd", case_id), {})
            per_commit.pop(commit, None)  # a re-run moves the commit to its newest place
            per_commit[commit] = float(median)
            sources.setdefault((name, pass_name or "fwd"), {})[commit] = src or ""
            chips.setdefault((name, pass_name or "fwd"), {})[commit] = device or ""
    return {k: list(v.items()) for k, v in out.items()}, sources, chips


def confirmed_steps(series: Series, commit: str, sources: Sources | None = None,
                    chips: Sources | None = None) -> dict[tuple[str, str, str], Step]:
    """The regression steps that `commit` (the newest point of each series) confirms:
    from its first bad commit on, the new level holds `CONFIRM_POINTS` to
    `CONFIRM_WINDOW` commits, the last of them this one, and has not recovered. A
    slowdown spread over small commits that no pairwise comparison flags is caught here
    once it is complete; while it stays confirmed the next few commits still show it,
    and `unreported` keeps only the steps no stored verdict has flagged yet (a step is
    one regression, at the commit that first flagged it; its alert stays open). Each candidate's mean
    over its cases is searched too (`candidate_series`, key (candidate, pass,
    ALL_CASES)): a slowdown of the whole kernel that each case's noise hides. `sources`
    (`history_from_db`) tells where the candidate's source changed: the prior of where
    a step began. `chips` (`history_with_chips`) tells which GPU each point ran on: a
    step whose points did not all run on one chip must hold `CONFIRM_POINTS_ACROSS`
    commits (`_points_needed`)."""
    out = {}
    for key, pts in {**series, **candidate_series(series, newest=commit)}.items():
        if len(pts) < MIN_POINTS or pts[-1][0] != commit:
            continue
        names = [c for c, _ in pts]
        changed = source_changes(names, None if sources is None else
                                 sources.get(key[:2], {}))
        on = None if chips is None else chips.get(key[:2], {})
        st = _confirmed(names, [m for _, m in pts], changed, on)
        if st is not None and (key[2] == ALL_CASES or _case_sized(
                st, _points_needed(names, names.index(st.first_bad), on)
                != CONFIRM_POINTS)):
            out[key] = st
    return out


CASE_STEP_MIN = 0.02  # a step of one case alone must be this large ...
CASE_STEP_K = 3.0  # ... and this many of its series' spreads
# Across chips, a step of one case alone must be twice that: chips of one model move
# single cases by several percent, and 2.0-2.8% steps of single cases held three commits
# on series from the committed cross-chip residuals of the quiet band turned 0.8% of
# their no-op commits red (bench/gate_verdicts.py --chips many); a 5% step of one case
# still clears it.
CASE_STEP_MIN_ACROSS = 0.04


def _case_sized(st: Step, across: bool = False) -> bool:
    """A run's dozens of case series each get a search, so a step of one case is held to
    more than a candidate's mean is: at least CASE_STEP_MIN and CASE_STEP_K spreads. On
    series from the committed residuals of the 0.5-1.5% band, 1.0-1.5% steps of single
    cases turned 5% of no-op commits red (bench/gate_verdicts.py); a slowdown of the
    whole kernel is found by the candidate's mean, which keeps the plain rule."""
    size = abs(math.log(st.ratio)) if st.ratio > 0 else 0.0
    floor = CASE_STEP_MIN_ACROSS if across else CASE_STEP_MIN
    return size >= max(math.log1p(floor), CASE_STEP_K * st.sigma)


CONFIRM_POINTS_ACROSS = 3  # commits at the new level, where its points ran on several chips


def _points_needed(names: Sequence[str], first_bad: int, chips: dict[str, str] | None) -> int:
    """Commits a step must hold before it is a regression. Across chips (the points
    around it, up to `WINDOW` before, not all on one known GPU), the run-to-run noise
    is a chip's offset, heavy-tailed: chips of one model differ by 3-30% for one case
    or one candidate (the committed H200 history), and two runs in a row on slow chips
    looked like a confirmed 1.3-2.7% step on series from those residuals
    (bench/gate_verdicts.py --chips many). A third commit at the new level is what the
    chips' tails make rare; it is still within 2 commits of the culprit."""
    if chips is None:
        return CONFIRM_POINTS
    seen = {chips.get(c, "") for c in names[max(0, first_bad - WINDOW):]}
    return CONFIRM_POINTS if len(seen) == 1 and "" not in seen else CONFIRM_POINTS_ACROSS


CONFIRM_K = 3.0  # the new level's mean over the commits holding it, in its standard errors


def _held_enough(st: Step, held: int) -> bool:
    """A step the gate calls from `held` commits at the new level must stand `CONFIRM_K`
    standard errors of their mean (sigma / sqrt(held)) above the level before: two runs
    are weak evidence of a level. The search's own rule (one spread and a U test) let
    1.1-1.8% steps of a candidate's mean, at spreads of 0.5-0.9%, turn no-op commits red
    from two runs on series of the committed 0.5-1.5% band (bench/gate_verdicts.py); a
    step that holds a third commit needs 1.7 spreads, so a real one is still called
    within 2 commits of its culprit."""
    size = abs(math.log(st.ratio)) if st.ratio > 0 else 0.0
    return size >= CONFIRM_K * st.sigma / math.sqrt(max(held, 1))


def _confirmed(names: Sequence[str], meds: Sequence[float], changed: list[bool] | None,
               chips: dict[str, str] | None = None) -> Step | None:
    """The regression step the newest point of a series confirms (confirmed_steps)."""
    for st in reversed(find_steps(names, meds, changed=changed, tail=CONFIRM_POINTS)):
        at = names.index(st.first_bad)
        held = len(names) - at  # commits at the new level
        needed = _points_needed(names, at, chips)
        if st.direction == "regression" and st.recovered_at is None and \
                needed <= held <= CONFIRM_WINDOW and _held_enough(st, held) and \
                (needed == CONFIRM_POINTS or _every_point_moved(meds, at, st)):
            return st
    return None


def _every_point_moved(meds: Sequence[float], at: int, st: Step) -> bool:
    """Across chips, every commit from the first bad one on lies nearer the new level
    than the old (above the median of up to `WINDOW` commits before it by half the
    step), not two of three: one chip of a model runs a case 5% slow in 2% of the
    committed cross-chip residuals, so two such chips among three commits made 5% steps
    of single cases, and 1-3% steps of 2-case candidates' means, that turned 1% of the
    no-op commits of series from those residuals red (bench/gate_verdicts.py --chips
    many, quiet band). A real step moves every commit."""
    xs = [math.log(m) for m in meds]
    before = xs[max(0, at - WINDOW):at]
    if not before:
        return False
    mid = statistics.median(before)
    half = math.log(st.ratio) / 2.0 if st.ratio > 0 else 0.0
    return all(x >= mid + half for x in xs[at:])


def unreported(db: Any, gpu_model_key: str | None, run_id: int, series: Series,
               steps: dict[tuple[str, str, str], Step]) -> dict[tuple[str, str, str], Step]:
    """The `steps` that no earlier stored run has flagged: a regression verdict of the same
    candidate and pass on the GPU model, in a run of a commit from the step's first bad
    one on. The gate is red once for a step, at the commit whose run first flagged it
    (pairwise, as a whole candidate, or by this search), not again at every commit that
    still holds the new level."""
    from sqlalchemy import select

    from harness.records.db.models import Comparison, Run

    out = {}
    for key, st in steps.items():
        commits = [c for c, _ in series.get(key) or candidate_series(series).get(key, [])]
        after = commits[commits.index(st.first_bad):] if st.first_bad in commits else []
        with db.session() as s:
            seen = s.execute(
                select(Comparison.id).join(Run, Run.id == Comparison.run_id)
                .where(Run.gpu_model_key == gpu_model_key, Run.id != run_id,
                       Run.commit.in_(after), Comparison.variant == key[0],
                       Comparison.pass_name == key[1], Comparison.verdict == "regression")
                .limit(1)).scalar() if after else None
        if seen is None:
            out[key] = st
    return out


def apply_steps(report: Any, steps: dict[tuple[str, str, str], Step]) -> int:
    """Turn the verdicts of `report` (harness.records.compare.Report) whose series shows
    a confirmed step into regressions naming the step; returns how many changed."""
    changed = 0
    whole: dict[tuple[str, str], list[Any]] = {}  # a candidate's step: its slower cases
    for v in report.verdicts:
        if v.verdict in ("regression", "correctness_regression"):
            continue
        st = steps.get((v.variant, v.pass_name, v.case_id))
        if st is not None:
            _mark(v, st, "")
            changed += 1
        elif (v.variant, v.pass_name, ALL_CASES) in steps and v.ratio:
            whole.setdefault((v.variant, v.pass_name), []).append(v)
    for (name, pass_name), vs in whole.items():
        # The step is the candidate's, not one case's: the cases slower in this
        # comparison carry it (the slowest one at least).
        st = steps[(name, pass_name, ALL_CASES)]
        for v in [v for v in vs if v.ratio > 1.0] or [max(vs, key=lambda v: v.ratio)]:
            _mark(v, st, " in the mean of the candidate's cases")
            changed += 1
    return changed


def _mark(v: Any, st: Step, where: str) -> None:
    v.detail["step"] = dict(st.to_dict(), whole_candidate=bool(where))
    v.detail["reason"] = (f"a step of {st.ratio - 1:+.1%}{where} across commits "
                          f"{st.last_good[:12]}..{st.first_bad[:12]}, confirmed by this "
                          f"commit (was: {v.verdict})")
    v.verdict = "regression"
    if not where:  # a case's own step is its ratio; a candidate's keeps the case's own
        v.ratio = st.ratio
