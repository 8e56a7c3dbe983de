"""bench/gate_verdicts.py end to end on a short series: the records it builds carry two
rounds' worth of confirmation and parent timings (the second up to MAX_CONFIRM_RUNS),
and they go through the real import / gate path to a score (the benchmark's tables in
docs/regressions.md come from this path at full length)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from benchscripts import load

from harness.records.confirm import MAX_CONFIRM_RUNS

RESULTS = Path(__file__).resolve().parents[1] / "results"


def test_a_short_series_with_confirmation_runs_is_judged_and_scored():
    gv = load("gate_verdicts")
    template = gv.slim(json.loads((RESULTS / gv.TEMPLATE).read_text()))
    pools = ([0.0, 0.004, -0.004, 0.008, -0.008], [0.0, 0.002, -0.002])
    runs, planted = gv.series(template, pools, length=7, chips="one", step=("whole", 0.05),
                              source_changes=0.3, rng=random.Random(3), confirm_runs=4)
    assert len(runs) == 7 and planted["kind"] == "whole"
    for i, rec in enumerate(runs):
        assert rec["_first"] == 4
        drawn = [ms for per_case in rec["_confirm"].values() for ms in per_case.values()]
        assert drawn and all(len(ms) == 4 + MAX_CONFIRM_RUNS for ms in drawn)
        assert ("_parent" in rec) == (i > 0)
    verdicts = gv.judge_series(runs)
    assert len(verdicts) == 7 and all(verdicts[1:])
    got = gv.score(template, verdicts, planted)
    assert got["noop"] == 7 - 1 - 3 and "at_commit" in got and "within_2" in got
