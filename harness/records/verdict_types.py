"""The per-commit verdict's levels, tails and what it decides (harness.records.verdict_stats,
whose module doc says why each is what it is)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from harness.records.noise import Key
from harness.records.verdict_history import Spread

MIN_CHANGE = 0.01  # the smallest change that is flagged, per case and per candidate
CASE_Q = 0.0025  # Benjamini-Hochberg level over the owned cases of one run
CANDIDATE_ALPHA = 0.0025  # one-sided, split over the owned candidates whose source changed
# A candidate whose source the commit left as it was: its share of the level is this
# fraction of CANDIDATE_ALPHA (the prior odds of a step where the code did not change, as
# harness.records.steps.UNCHANGED_PRIOR), split over those candidates.
UNCHANGED_SHARE = 0.05
# The tails of real run-to-run noise (module doc, 5.): Student t fits of the committed
# records' residuals in robust spreads, per case and per candidate (the mean of a run's
# cases), on one chip: bench/gate_verdicts.py --tails.
CASE_TAIL_DF = 1.5
CANDIDATE_TAIL_DF = math.inf  # one chip: the moderated spread's own degrees of freedom
# Across chips (a run on another GPU than its baseline's, or unknown): the chips of one
# model differ by several percent for a whole candidate (1.3 degrees of freedom fitted).
ACROSS_TAIL_DF = 1.5
PROTECTED_ALPHA = 0.05  # a case of a candidate found slower as a whole
OPEN_ALPHA = 0.01  # unadjusted p below this and beyond MIN_CHANGE: "inconclusive"
LARGE_CHANGE = 0.05  # a case's change this large ...
LARGE_K = 15.0  # ... and this many spreads of the difference is flagged on its own
# A candidate of fewer than ROBUST_CASES cases confirmed by at least this many runs is
# judged by the mean of its cases (module doc, 6.), not the least-moved one.
CONFIRMED_MEAN_RUNS = 3
# A confirmed candidate is tested at this share of its level: the gate may look at it
# twice (after the first round of confirmation runs, and after a second where the first
# left it undecided, harness.records.confirm.extend), and the two looks' levels must sum
# to at most the candidate's (module doc, 7.).
LOOK_SHARE = 0.5


@dataclass
class CaseChange:
    key: Key
    d: float  # ln(new) - mean ln(window)
    n_base: int
    spread: Spread
    p_up: float
    p_down: float
    yardstick: bool
    one_chip: bool = True  # its baseline ran on the same GPU (uuid known and equal)
    runs: int = 1  # runs of the new commit averaged in d (1 + its confirmations)
    logs: list[float] = field(default_factory=list)  # ln medians of the new commit's runs
    # ln medians of the parent's code timed by this run on its GPU, the baseline this
    # case was judged against in place of the window (empty: judged against the window)
    parent: list[float] = field(default_factory=list)


@dataclass
class CandidateChange:
    """The candidate-level verdict (module doc, 3.)."""

    variant: str
    pass_name: str
    cases: int
    ratio: float
    spread: Spread
    p_value: float  # one-sided, slower
    alpha: float
    yardstick: bool
    verdict: str = "same"
    bar: float = 0.0  # the smallest whole-candidate slowdown this run could flag
    runs: int = 1  # runs of the new commit averaged (1 + its confirmations)
    changed: bool = True  # the commit changed its source (or it is unknown)
    mean_ratio: float = 1.0  # exp of the mean of its cases' changes
    one_chip: bool = True  # every case's baseline ran on the new run's GPU
    # "history": against the baseline window; "parent": against the parent's code timed
    # by this run on its own GPU, in the same minutes (harness.records.same_runner)
    against: str = "history"
    n_base: int = 1  # runs on the baseline side (the window's, or the parent's timings)
    tail_df: float = math.inf  # the most degrees of freedom its p-value is read with

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "pass": self.pass_name, "cases": self.cases,
                "ratio": self.ratio, "spread": self.spread.value, "df": self.spread.df,
                "pairs": self.spread.pairs, "p_value": self.p_value, "alpha": self.alpha,
                "bar": self.bar, "runs": self.runs, "against": self.against,
                "verdict": self.verdict}


@dataclass
class RunDecision:
    """What the history-aware rules decided for one run: per case and per candidate."""

    cases: dict[Key, CaseChange] = field(default_factory=dict)
    candidates: list[CandidateChange] = field(default_factory=list)
