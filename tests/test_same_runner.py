"""A confirmed candidate against its parent's code timed by the same run, on its own GPU
(harness.records.same_runner), the two looks (verdict_stats, 7.; confirm.extend) and the
gate's second round (harness.runs.gate_confirm)."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import numpy as np
import pytest
from scipy import stats

from harness.records import confirm as cf
from harness.records import same_runner as sr
from harness.records import verdict_stats as vs
from harness.records.compare import Verdict
from harness.records.noise import NoiseModel

KEYS = [("k", "fwd", f"c{i}") for i in range(4)]


@pytest.mark.parametrize("seed", range(5))
def test_the_pooled_test_is_students_two_sample_t(seed):
    rng = random.Random(seed)
    a = [rng.gauss(0.01, 0.005) for _ in range(5)]
    b = [rng.gauss(0.0, 0.005) for _ in range(4)]
    got = sr.change([a], [b])
    assert got is not None
    d, spread, ka, kb = got
    ref = stats.ttest_ind(a, b, equal_var=True, alternative="greater")
    assert (ka, kb) == (5, 4) and spread.df == 7
    assert d == pytest.approx(statistics.fmean(a) - statistics.fmean(b))
    assert spread.p_up(d, kb, runs=ka) == pytest.approx(ref.pvalue, rel=1e-9)


def test_a_runs_level_is_its_cases_mean_over_the_runs_all_of_them_have():
    assert sr.run_levels([[1.0, 2.0, 3.0], [3.0, 4.0]]) == [2.0, 3.0]
    assert sr.run_levels([]) == []
    assert sr.change([[0.0, 0.1]], [[0.0, 0.1, 0.2]]) is None  # 2 runs: too few
    assert sr.change([[0.0] * 4], [[0.0] * 4]) is None  # no spread at all to read against


def test_a_prior_spread_is_worth_its_degrees_of_freedom():
    a, b = [0.0, 0.001, -0.001], [0.0, 0.001, -0.001]
    plain = sr.pooled(a, b)
    moderated = sr.pooled(a, b, prior=0.01)
    assert plain is not None and moderated is not None
    assert plain.df == 4 and moderated.df == 4 + vs.PRIOR_DF
    assert plain.value < moderated.value < 0.01


def _cross_chip_history(rng: random.Random) -> NoiseModel:
    """Eight A/A runs of a 4-case candidate, each on another chip (offsets of 3%)."""
    model = NoiseModel()
    for r in range(8):
        chip = rng.gauss(0.0, 0.03)
        common = rng.gauss(0.0, 0.003)
        for k in KEYS:
            model.add(k, "src", math.exp(chip + common + rng.gauss(0.0, 0.003)), f"GPU-{r}", r)
    return model


def _judge(model: NoiseModel, chip: float, step: float, rng: random.Random,
           parent: bool = True, runs: int = 5):
    """A new run on a chip `chip` away from the history's, its code `step` slower than
    its parent's; both timed by the run (runs of the commit, 4 of the parent)."""
    entries = {}
    for k in KEYS:
        level = statistics.fmean(math.log(p[1]) for p in model.points[k][-5:])
        logs = [level + chip + step + rng.gauss(0.0, 0.003) for _ in range(runs)]
        par = [level + chip + rng.gauss(0.0, 0.003) for _ in range(4)]
        entries[k] = {"status": "passed", "median_ms": math.exp(logs[0]),
                      "confirm_ms": [math.exp(x) for x in logs[1:]]}
        if parent:
            entries[k]["parent_ms"] = [math.exp(x) for x in par]
    base = {k: [{"status": "passed", "median_ms": model.points[k][-1][1]}] for k in KEYS}
    verdicts = [Verdict(k[0], k[2], "same", pass_name=k[1]) for k in KEYS]
    out = vs.decide(verdicts, entries, base, {"k": "src"}, model, device="GPU-new",
                    across_of=lambda _k: True, yardstick=lambda _n: False)
    return out.candidates[0]


@pytest.mark.parametrize("seed", range(4))
def test_across_chips_a_2pct_slowdown_is_read_against_its_parent_on_this_chip(seed):
    rng = random.Random(seed)
    model = _cross_chip_history(rng)
    # A chip 4% faster than the history's: against the window the slowdown is hidden.
    cand = _judge(model, -0.04, math.log(1.02), rng)
    assert cand.against == "parent" and cand.one_chip  # the parent ran on its chip
    assert cand.ratio == pytest.approx(1.02, abs=0.005)
    assert cand.verdict == "regression" and cand.runs == 5
    # Without the parent's timings it is the window's verdict, which cannot see it.
    hidden = _judge(model, -0.04, math.log(1.02), rng, parent=False)
    assert hidden.against == "history" and hidden.verdict == "same"


@pytest.mark.parametrize("seed", range(4))
def test_across_chips_a_slow_chip_with_code_unchanged_stays_green(seed):
    rng = random.Random(100 + seed)
    model = _cross_chip_history(rng)
    cand = _judge(model, 0.05, 0.0, rng)  # 5% slower chip, the same code
    assert cand.against == "parent" and cand.verdict == "same"
    assert cand.ratio == pytest.approx(1.0, abs=0.006)


def test_a_confirmed_candidate_is_tested_at_half_its_level():
    rng = random.Random(7)
    model = _cross_chip_history(rng)
    confirmed = _judge(model, 0.0, 0.0, rng)
    one = _judge(model, 0.0, 0.0, rng, parent=False, runs=1)
    assert one.runs == 1 and one.alpha == pytest.approx(vs.CANDIDATE_ALPHA)
    assert confirmed.alpha == pytest.approx(vs.CANDIDATE_ALPHA * vs.LOOK_SHARE)


def _report(*cands):
    from types import SimpleNamespace

    return SimpleNamespace(candidates=list(cands), verdicts=[])


def _cc(p: float, ratio: float = 1.015, runs: int = 5, verdict: str = "same",
        one_chip: bool = True, changed: bool = True):
    c = vs.CandidateChange("k", "fwd", 4, ratio, vs.Spread(0.005, 10, 8, None), p, 0.001,
                           False, verdict=verdict, runs=runs, changed=changed,
                           mean_ratio=ratio, one_chip=one_chip)
    return c


def test_a_suspect_left_undecided_gets_a_second_round():
    s = cf.Suspect("k", "fwd", 1.015, 0.1)
    [again] = cf.extend(_report(_cc(0.01)), [s])
    assert (again.variant, again.pass_name, again.ratio, again.p_value) == ("k", "fwd", 1.015,
                                                                            0.01)
    assert cf.CONFIRM_RUNS <= again.runs <= cf.MAX_CONFIRM_RUNS
    assert cf.extend(_report(_cc(0.2)), [s]) == []  # clearly nothing
    assert cf.extend(_report(_cc(1e-6, verdict="regression")), [s]) == []  # decided
    assert cf.extend(_report(_cc(0.01, ratio=0.99)), [s]) == []  # read faster
    assert cf.extend(_report(_cc(0.01, runs=1)), [s]) == []  # nothing was timed again
    step = cf.Suspect("k", "fwd", 1.02, math.nan, step="a..b")
    assert cf.extend(_report(_cc(0.01)), [step]) == []  # a step is the search's
    assert cf.extend(None, [s]) == []


def test_across_chips_every_changed_candidate_is_a_suspect(history):
    from test_confirm import KERNEL, _aa, _planted

    from harness.records.db.store import open_db

    moved = _planted(0.97)  # read 3% faster: on one chip no suspect
    elsewhere = _planted(0.97)
    elsewhere.gpu = {**elsewhere.gpu, "uuid": "GPU-another-chip"}
    unchanged = _aa(9)
    unchanged.gpu = {**unchanged.gpu, "uuid": "GPU-another-chip"}
    with open_db(history) as db:
        assert cf.suspects(cf.preliminary(db, moved)) == []
        assert cf.across_suspects(db, moved) == []  # the baseline's chip: the screen's
        found = cf.across_suspects(db, elsewhere)
        assert cf.across_suspects(db, unchanged) == []  # its code did not change
        both = cf.suspects(cf.preliminary(db, elsewhere), steps=found)
    assert sorted((s.variant, s.pass_name) for s in found) == [(KERNEL, "bwd"), (KERNEL, "fwd")]
    assert all(math.isnan(s.p_value) and s.ratio == pytest.approx(0.97, abs=0.01)
               for s in found)
    assert sorted((s.variant, s.pass_name) for s in both) == [(KERNEL, "bwd"), (KERNEL, "fwd")]


def test_the_gate_times_an_undecided_suspect_a_second_round(history, monkeypatch):
    """After the first round the run is judged again; a suspect `extend` names is timed as
    many times more, and the note and the record say two rounds."""
    from test_confirm import KERNEL, _execution, _planted, _same_chip_runs, _timed

    from harness.runs import gate_confirm
    from harness.runs.gate_options import GateOptions

    rec = _planted(1.02)
    looked: list[int] = []

    def undecided(report, found, first):
        assert first == cf.CONFIRM_RUNS
        looked.append(min(c.runs for c in report.candidates if c.variant == KERNEL))
        return [dataclasses.replace(s, runs=6) for s in found if s.pass_name == "fwd"]

    monkeypatch.setattr(cf, "extend", undecided)
    notes = gate_confirm.confirm(rec, _execution(rec), GateOptions(db_url=history),
                                 log=lambda _l: None, time_again=_same_chip_runs(rec, 1.02),
                                 time_parent=lambda *_a: ({}, "not wanted here"))
    assert looked == [1 + cf.CONFIRM_RUNS]  # judged again with the first round in it
    runs = {e.get("pass") or "fwd": len(e["confirm_ms"]) for e in _timed(rec)}
    assert runs == {"fwd": cf.CONFIRM_RUNS + 6, "bwd": cf.CONFIRM_RUNS}  # the sized round
    done = {d["pass"]: d for d in rec.env["ci_confirm"]}
    assert done["fwd"]["rounds"] == 2 and done["bwd"]["rounds"] == 1
    assert any(f"timed {cf.CONFIRM_RUNS + 6} more time(s) in 2 rounds" in n for n in notes)


def _power(c, k: int, draws: int = 20000) -> float:
    """How often the candidate's test rejects after a second round of k runs when the
    code is TARGET_STEP slower: a simulation of the test itself (a normal mean difference
    over a spread estimated with chi-square degrees of freedom), not of the formula."""
    rng = np.random.default_rng(5)
    paired = c.against == "parent"
    ka, kb = c.runs + k, (c.n_base + k if paired else c.n_base)
    df = min(c.spread.df + (2 * k if paired else 0), c.tail_df)
    se = c.spread.value * math.sqrt(1 / ka + 1 / kb)
    d = rng.normal(math.log1p(cf.TARGET_STEP), se, draws)
    s = c.spread.value * np.sqrt(rng.chisquare(df, draws) / df)
    t = d / (s * math.sqrt(1 / ka + 1 / kb))
    crit = stats.t.isf(c.alpha, df)
    return float(np.mean((t > crit) & (d >= math.log1p(vs.MIN_CHANGE))))


@pytest.mark.parametrize(("spread", "against"), [(0.0025, "parent"), (0.007, "parent"),
                                                  (0.01, "parent"), (0.007, "history")])
def test_the_second_round_is_sized_for_the_target_step(spread, against):
    """The fewest runs whose simulated power reaches TARGET_POWER (or the most allowed)."""
    c = dataclasses.replace(_cc(0.01), spread=vs.Spread(spread, 11, 9, None), alpha=0.0006,
                            against=against, n_base=4 if against == "parent" else 5)
    k = cf.second_round(c, cf.CONFIRM_RUNS)
    assert cf.CONFIRM_RUNS <= k <= cf.MAX_CONFIRM_RUNS
    if k < cf.MAX_CONFIRM_RUNS:
        assert _power(c, k) >= cf.TARGET_POWER - 0.01
    if k > cf.CONFIRM_RUNS:
        assert _power(c, k - 1) < cf.TARGET_POWER + 0.01


def test_a_noisier_candidate_gets_a_longer_second_round():
    def size(spread: float) -> int:
        c = dataclasses.replace(_cc(0.01), spread=vs.Spread(spread, 11, 9, None),
                                alpha=0.0006, against="parent", n_base=4)
        return cf.second_round(c, cf.CONFIRM_RUNS)

    sizes = [size(s) for s in (0.002, 0.005, 0.007, 0.01, 0.03)]
    assert sizes == sorted(sizes)
    assert sizes[0] == cf.CONFIRM_RUNS and sizes[-1] == cf.MAX_CONFIRM_RUNS
    # a first round asked longer by the team is never shortened
    c = dataclasses.replace(_cc(0.01), spread=vs.Spread(0.002, 11, 9, None), alpha=0.0006)
    assert cf.second_round(c, 7) == 7


def test_a_history_of_one_other_chip_judges_the_new_chip_against_its_parent():
    """A team's history all on one runner, the commit gated on another: the history has
    no pair across chips to read a window against, but the parent's code timed here does
    (one chip's spreads from the history moderating the runs' own)."""
    from test_verdict_stats import _model, _Rng

    model = _model(KEYS, _Rng(3), runs=8, spread=0.004)  # every run on GPU-a
    rng = random.Random(5)
    slow = _judge(model, 0.03, math.log(1.02), rng)
    same = _judge(model, 0.03, 0.0, rng)
    assert slow.against == same.against == "parent"
    assert slow.verdict == "regression" and same.verdict == "same"
    assert slow.spread.prior is not None  # the history's one-chip spread of its mean
    # Without the parent's timings across chips nothing is judged by the history here.
    assert _judge_none(model, rng) == []


def _judge_none(model: NoiseModel, rng: random.Random):
    entries = {k: {"status": "passed", "median_ms": model.points[k][-1][1] * 1.03}
               for k in KEYS}
    base = {k: [{"status": "passed", "median_ms": model.points[k][-1][1]}] for k in KEYS}
    verdicts = [Verdict(k[0], k[2], "same", pass_name=k[1]) for k in KEYS]
    return vs.decide(verdicts, entries, base, {"k": "src"}, model, device="GPU-new",
                     across_of=lambda _k: True, yardstick=lambda _n: False).candidates


def _scaled_parent(factor: float, source: str):
    import itertools

    from test_confirm import _aa, _timed

    from harness.records.record import entry_pass

    it = itertools.cycle([_aa(i) for i in (4, 5, 6, 7)])

    def time_parent(kernel, case_ids, pass_name):
        return ({e["case_id"]: e["median_ms"] * factor for e in _timed(next(it))
                 if entry_pass(e) == pass_name and e["case_id"] in case_ids}, source)
    return time_parent


@pytest.mark.parametrize(("code", "red"), [(1.02, True), (1.0, False)])
def test_the_gate_on_a_faster_chip_judges_the_commit_against_its_parent_there(history, code, red):
    """The history on one H100, the commit gated on another chip 4% faster: read against
    the window it is faster whatever its code; the gate times the parent's code on this
    chip, and a 2% slowdown is red at its commit while the same code stays green."""
    from test_confirm import KERNEL, _aa, _execution, _planted, _same_chip_runs

    from harness.records.db.store import open_db
    from harness.runs import gate_confirm
    from harness.runs.gate_options import GateOptions

    chip = 0.96
    rec = _planted(code * chip, source=f"changed-{code}")
    rec.gpu = {**rec.gpu, "uuid": "GPU-another-chip"}
    notes = gate_confirm.confirm(
        rec, _execution(rec), GateOptions(db_url=history), log=lambda _l: None,
        time_again=_same_chip_runs(rec, code * chip),
        time_parent=_scaled_parent(chip, _aa(8).kernels[KERNEL]["source_hash"]))
    assert all("on another chip than its baseline's" in n and "its parent's code on" in n
               for n in notes), notes
    with open_db(history) as db:
        report = cf.preliminary(db, rec)
    cands = [c for c in report.candidates if c.variant == KERNEL]
    assert cands and all(c.against == "parent" for c in cands)
    assert any(c.verdict == "regression" for c in cands) is red
    assert all(c.ratio == pytest.approx(code, abs=0.01) for c in cands)
