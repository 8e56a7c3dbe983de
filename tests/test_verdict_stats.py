"""The per-commit verdict with the run-to-run noise known (harness.records.verdict_stats):
the spread of a difference of runs, moderated spreads, the candidate as a whole, the many
cases of one run under false-discovery control, heavy tails."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

from harness.records import verdict_stats as vs
from harness.records.compare import Verdict, compare_records
from harness.records.noise import NoiseModel, from_rows
from harness.records.record import RunRecord

RESULTS = Path(__file__).resolve().parents[1] / "results"


def test_a_difference_of_runs_has_the_spread_of_both():
    s = vs.Spread(0.01, math.inf, 10, None)
    # One run against one: sqrt 2 spreads; against the mean of 4: sqrt 1.25.
    assert s.t(0.01 * math.sqrt(2.0), 1) == pytest.approx(1.0)
    assert s.t(0.01 * math.sqrt(1.25), 4) == pytest.approx(1.0)


def test_a_short_history_is_shrunk_toward_the_prior_and_counts_its_uncertainty():
    few = vs.Spread.moderate([0.001, 0.0012], prior=0.01)
    assert few is not None and 0.009 < few.value < 0.01  # two pairs barely move the prior
    assert few.df == pytest.approx(vs.PRIOR_DF + 2 * vs.MAD_EFFICIENCY)
    many = vs.Spread.moderate([0.0015] * 200, prior=0.01)
    assert many is not None and many.value < 0.003  # a long history speaks for itself
    assert vs.Spread.moderate([0.001], prior=None) is None  # one pair, no prior: unknown
    # The same change is weaker evidence against a spread of few degrees of freedom.
    assert few.p_up(0.05, 5) > vs.Spread(few.value, 100.0, 200, None).p_up(0.05, 5)


def test_the_walsh_median_ignores_one_wild_case():
    assert vs.walsh_median([0.02] * 7 + [0.5]) == pytest.approx(0.02)
    assert vs.walsh_median([0.0, 0.02]) == pytest.approx(0.01)


def _tail(rng, spread):
    """Heavy-tailed noise as one chip's committed residuals: Student t with 1.5 degrees
    of freedom in robust spreads, cut at the 15 spreads the largest of them reached."""
    return max(-15.0, min(15.0, rng.standard_t(1.5) * 0.7)) * spread


def _model(keys, rng, runs=12, spread=0.003, tail=False):
    """A history of `runs` A/A runs of one chip (run ids 0..runs-1)."""
    model = NoiseModel()
    for r in range(runs):
        common = rng.gauss(0.0, spread / 2)
        for k in keys:
            e = _tail(rng, spread) if tail else rng.gauss(0.0, spread)
            model.add(k, "src", math.exp(common + e), "GPU-a", r)
    return model


class _Rng(random.Random):
    def standard_t(self, df):
        return self.gauss(0, 1) / math.sqrt(self.gammavariate(df / 2, 2) / df)


def _decide(model, new_medians, yard=()):
    keys = list(new_medians)
    verdicts = [Verdict(k[0], k[2], "same", pass_name=k[1]) for k in keys]
    entries = {k: {"status": "passed", "median_ms": m} for k, m in new_medians.items()}
    # The baseline is the history's newest run (the gate's parent run).
    base = {k: [{"status": "passed", "median_ms": model.points[k][-1][1]}] for k in keys}
    out = vs.decide(verdicts, entries, base, {k[0]: "src" for k in keys}, model, device="GPU-a",
                    across_of=lambda k: False, yardstick=lambda n: n in yard)
    return out, {(v.variant, v.pass_name, v.case_id): v for v in verdicts}


def test_a_whole_kernel_slowdown_is_red_where_each_case_alone_is_not():
    rng = _Rng(3)
    keys = [("k", "fwd", f"c{i}") for i in range(16)]
    model = _model(keys, rng)
    level = {k: statistics_mean_log(model, k) for k in keys}
    new = {k: math.exp(level[k] + math.log(1.02) + rng.gauss(0, 0.003)) for k in keys}
    out, verdicts = _decide(model, new)
    cand = out.candidates[0]
    assert cand.verdict == "regression" and 1.015 < cand.ratio < 1.025
    assert any(v.verdict == "regression" for v in verdicts.values())
    assert all(v.detail["candidate"]["verdict"] == "regression"
               for v in verdicts.values() if v.verdict == "regression")
    # Unchanged: nothing flagged.
    same = {k: math.exp(level[k] + rng.gauss(0, 0.003)) for k in keys}
    out, verdicts = _decide(model, same)
    assert out.candidates[0].verdict == "same"
    assert all(v.verdict in ("same", "inconclusive") for v in verdicts.values())


def test_the_level_goes_where_the_source_changed():
    """A weighted Bonferroni (module doc, 3.): a candidate whose source the commit changed
    gets CANDIDATE_ALPHA split over the changed ones; one left as it was a small share."""
    rng = _Rng(3)
    keys = [(f"k{j}", "fwd", f"c{i}") for j in range(4) for i in range(8)]
    model = _model(keys, rng)
    new = {k: math.exp(statistics_mean_log(model, k)) for k in keys}
    verdicts = [Verdict(k[0], k[2], "same", pass_name=k[1]) for k in keys]
    entries = {k: {"status": "passed", "median_ms": m} for k, m in new.items()}
    base = {k: [{"status": "passed", "median_ms": model.points[k][-1][1]}] for k in keys}
    out = vs.decide(verdicts, entries, base, {k[0]: "src" for k in keys}, model,
                    device="GPU-a", across_of=lambda k: False, yardstick=lambda n: False,
                    changed=lambda n: n == "k0")
    alpha = {c.variant: c.alpha for c in out.candidates}
    assert alpha["k0"] == pytest.approx(vs.CANDIDATE_ALPHA)
    assert alpha["k1"] == pytest.approx(vs.CANDIDATE_ALPHA * vs.UNCHANGED_SHARE / 3)
    bars = {c.variant: c.bar for c in out.candidates}
    assert bars["k0"] < min(bars["k1"], bars["k2"], bars["k3"])


def test_a_candidate_of_few_cases_needs_every_case_to_move():
    """Two cases' Walsh median is their mean, which one case's heavy-tailed excursion
    moves: a candidate of fewer than ROBUST_CASES cases changes by its least-moved case
    (module doc, 3.). One case 2.4% slower alone does not make it slower (its mean would be
    +1.2%, p < 1e-9 at a 0.1% spread); both cases 1.2% slower do."""
    rng = _Rng(4)
    two = [("k", "fwd", "c0"), ("k", "fwd", "c1")]
    model = _model(two, rng, spread=0.001)
    level = {k: statistics_mean_log(model, k) for k in two}
    one = {two[0]: math.exp(level[two[0]] + math.log(1.024)), two[1]: math.exp(level[two[1]])}
    out, _ = _decide(model, one)
    assert out.candidates[0].verdict == "same" and out.candidates[0].p_value > 0.05
    both = {k: math.exp(level[k] + math.log(1.012)) for k in two}
    out, _ = _decide(model, both)
    assert out.candidates[0].verdict == "regression"
    assert 1.008 < out.candidates[0].ratio < 1.016


def test_the_smallest_of_a_few_cases_is_centred_on_its_aa_runs():
    """With nothing changed the least-moved of two cases is below zero by about half a
    spread: its A/A pairs' median is taken out (`centred`), else every run would read as
    faster and a slowdown's bar would be too high."""
    pairs = [-0.004, -0.002, -0.003, 0.001, -0.006, -0.001]
    centred, centre = vs.centred(pairs, 2)
    assert centre == pytest.approx(-0.0025)
    assert statistics.median(centred) == pytest.approx(0.0)
    assert vs.centred(pairs, vs.ROBUST_CASES) == (pairs, 0.0)


def statistics_mean_log(model, key):
    xs = [math.log(m) for _, m, _ in model.points[key]][-vs.WINDOW:]
    return sum(xs) / len(xs)


def test_many_cases_of_heavy_tailed_noise_rarely_make_a_red_run():
    # 200 runs that changed nothing, 40 cases of 4 candidates, noise with the tails of one
    # chip's committed records (_tail): at most 1% red.
    rng = _Rng(11)
    keys = [(f"k{j}", "fwd", f"c{i}") for j in range(4) for i in range(10)]
    red = 0
    for _ in range(200):
        model = _model(keys, rng, runs=10, tail=True)
        new = {k: math.exp(statistics_mean_log(model, k) + _tail(rng, 0.003))
               for k in keys}
        _, verdicts = _decide(model, new)
        red += any(v.verdict == "regression" for v in verdicts.values())
    assert red <= 2, red


def test_a_yardsticks_cases_are_their_own_family():
    rng = _Rng(5)
    keys = [("peer", "fwd", f"c{i}") for i in range(8)] + [("ours", "fwd", f"c{i}")
                                                            for i in range(8)]
    model = _model(keys, rng)
    new = {k: math.exp(statistics_mean_log(model, k) + (math.log(1.05) if k[0] == "peer"
                                                          else 0.0)) for k in keys}
    out, verdicts = _decide(model, new, yard=("peer",))
    assert {v.variant for v in verdicts.values() if v.verdict == "regression"} == {"peer"}
    assert next(c for c in out.candidates if c.variant == "peer").yardstick


def _h100(pattern):
    return [RunRecord.read(p) for p in sorted(RESULTS.glob(pattern))]


def _history(records):
    return from_rows([(e["kernel"], (r.kernels.get(e["kernel"]) or {}).get("source_hash", ""),
                       e.get("pass", "fwd"), e["case_id"], e["median_ms"],
                       r.gpu.get("uuid", ""), i)
                      for i, r in enumerate(records) for e in r.results
                      if e.get("status") == "passed" and e.get("median_ms")])


@pytest.mark.parametrize("pattern", ["h100-20261206T02*-ci-aa*.json",
                                     "h100-20261206T1[34]*-ci-aa*.json",
                                     "h200-20261202T02*-ci-aa*.json",
                                     "h200-20261206T230*-ci-aa*.json"])
def test_real_aa_runs_of_one_chip_are_never_red(pattern):
    # Each of four or five `ci` runs of one commit on one chip judged against the runs
    # before it, with their history, as the gate would: none red.
    runs = _h100(pattern)
    assert len(runs) >= 4
    for i in range(1, len(runs)):
        report = compare_records(runs[:i], runs[i], noise=_history(runs[:i]))
        assert not [v for v in report.verdicts if v.verdict == "regression"], i


def test_a_planted_2pct_commit_on_an_h200_is_red_as_a_whole_candidate():
    # The H200 of 2026-12-06 (GPU-4c1f3380): four A/A `ci` runs, then fa2_mma slowed by 2%
    # (bench/plant_slowdown.py) as the next commit, whose `ci` exited 1. Its backward's
    # four cases moved +1.5-2.6%; as a whole +2.0% against a run-to-run spread of the
    # candidate of a few tenths of a percent: red, at that commit.
    runs = _h100("h200-20261206T230*-ci-aa*.json")
    planted = RunRecord.read(Path(__file__).parent / "data" /
                             "h200-20261206-ci-planted-2pct-fa2_mma-570a460-record.json")
    report = compare_records(runs, planted, noise=_history(runs))
    assert report.regressed
    whole = next(c for c in report.candidates if (c.variant, c.pass_name) == ("fa2_mma", "bwd"))
    assert whole.verdict == "regression" and 1.015 < whole.ratio < 1.03
    bad = [v for v in report.verdicts if v.verdict == "regression"]
    assert bad and {(v.variant, v.pass_name) for v in bad} == {("fa2_mma", "bwd")}
