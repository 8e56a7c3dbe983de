"""Regression verdicts: timing (ratio + U test + median intervals), correctness,
precision drift, GPU model separation, and the `fa-harness compare` exit codes."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from harness.cli import main as cli_main
from harness.records.compare import (
    CompareError,
    Policy,
    compare_records,
    compare_samples,
    median_interval,
)
from harness.records.synthetic import make_record, specs_for


def _samples(n: int, scale: float, noise: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [scale * (1 + rng.gauss(0, noise)) for _ in range(n)]


def test_median_interval_is_the_sign_test_interval():
    xs = list(range(1, 21))  # n = 20: binomial 5% quantile gives ranks 6 and 15
    assert median_interval(xs, 0.90) == (6, 15)
    assert median_interval([3.0], 0.9) == (3.0, 3.0)


def test_clear_slowdown_is_a_regression_and_speedup_an_improvement():
    base = _samples(30, 1.0, 0.01, 1)
    v, ratio, p, detail = compare_samples(base, _samples(30, 1.05, 0.01, 2))
    assert v == "regression" and ratio == pytest.approx(1.05, abs=0.01) and p < 1e-6
    assert all(detail["rules"].values())
    v, ratio, _, _ = compare_samples(base, _samples(30, 0.94, 0.01, 3))
    assert v == "improvement" and ratio < 0.97


def test_identical_builds_are_same_even_with_outliers():
    flagged = 0
    for seed in range(200):
        base = _samples(20, 1.0, 0.015, seed)
        new = _samples(20, 1.0, 0.015, 1000 + seed)
        new[0] *= 1.5  # a preempted sample
        new[1] *= 1.3
        flagged += compare_samples(base, new)[0] in ("regression", "improvement")
    assert flagged <= 2


def test_small_real_change_under_threshold_is_same():
    # 1% slower with tiny noise: statistically real, practically irrelevant.
    v, ratio, p, _ = compare_samples(_samples(40, 1.0, 0.001, 1), _samples(40, 1.01, 0.001, 2))
    assert v == "same" and p < 1e-6 and ratio == pytest.approx(1.01, abs=0.002)


def test_large_ratio_from_noise_is_inconclusive():
    # Two samples per tail, heavy noise: ratio beyond 2% but the test cannot confirm.
    base = [1.0, 1.3, 0.7, 1.1, 0.9, 1.2]
    new = [1.1, 1.4, 0.8, 1.2, 1.0, 1.25]
    v, ratio, p, detail = compare_samples(base, new)
    assert ratio > 1.02 and v == "inconclusive" and "not confirmed" in detail["reason"]


def test_medians_only_call_only_large_changes():
    assert compare_samples([], [], base_median=1.0, new_median=1.05)[0] == "inconclusive"
    assert compare_samples([], [], base_median=1.0, new_median=1.01)[0] == "same"
    assert compare_samples([], [], base_median=1.0, new_median=1.2)[0] == "regression"


def _pair(**changes):
    specs = specs_for(samples=25)
    base = make_record(specs, seed=1, commit="a" * 40)
    new_specs = specs_for(samples=25)
    for idx, attrs in changes.items():
        for k, v in attrs.items():
            setattr(new_specs[int(idx[1:])], k, v)
    new = make_record(new_specs, seed=2, commit="b" * 40, parent="a" * 40, minutes=10)
    return base, new


def test_records_compare_per_kernel_and_case():
    base, new = _pair(i0={"median_ms": 1.0 * 1.08}, i1={"status": "failed"},
                      i2={"err_ratio": 1.6}, i3={"median_ms": 1.3 * 0.9})
    report = compare_records(base, new)
    by_case = {(v.variant, v.case_id): v.verdict for v in report.verdicts}
    verdicts = [by_case[(e["kernel"], e["case_id"])] for e in new.results]
    assert verdicts[:4] == ["regression", "correctness_regression", "precision_drift",
                            "improvement"]
    assert set(verdicts[4:]) == {"same"}
    assert report.regressed and len(report.failing) == 3
    md = report.markdown()
    assert "correctness_regression" in md and "| regression |" in md
    # Base failing, new passing: fixed, and not a failure.
    fixed = compare_records(new, base)
    assert any(v.verdict == "correctness_fixed" for v in fixed.verdicts)


def test_precision_drift_needs_both_factor_and_floor():
    base, new = _pair(i0={"err_ratio": 0.9})  # 0.8 -> 0.9: fine
    assert not compare_records(base, new).regressed
    base, new = _pair(i0={"err_ratio": 1.19})  # 1.49x and above 1.0: just under the factor
    assert not compare_records(base, new).regressed


def test_missing_entries_fail_new_ones_do_not():
    base = make_record(specs_for(kernels=("fa2", "naive")), seed=1)
    new = make_record(specs_for(kernels=("fa2", "fa1")), seed=2, minutes=1)
    report = compare_records(base, new)
    c = report.counts()
    assert c.get("missing") == 3 and c.get("new") == 3
    # naive dropped out of the run: that fails, a new kernel (fa1) does not
    assert report.regressed
    assert {v.variant for v in report.failing} == {"naive"}
    for v in report.verdicts:
        if v.verdict == "missing":
            v.detail["excused"] = "not selected"
    assert not report.regressed
    only_new = make_record(specs_for(kernels=("fa2", "naive", "fa1")), seed=3, minutes=2)
    assert not compare_records(base, only_new).regressed


def test_window_baseline_pools_samples():
    bases = [make_record(specs_for(samples=8), seed=s, minutes=s) for s in range(5)]
    slow = specs_for(samples=8)
    slow[0].median_ms *= 1.04
    report = compare_records(bases, make_record(slow, seed=99, minutes=60))
    v0 = next(v for v in report.verdicts if v.variant == "fa2" and v.case_id ==
              bases[0].results[0]["case_id"])
    assert v0.detail["n_base"] == 40 and v0.detail["base_runs"] == 5
    assert v0.verdict == "regression"


def test_different_gpu_models_refuse_to_compare():
    base = make_record(specs_for(), seed=1)
    other = make_record(specs_for(), seed=2, gpu={"name": "NVIDIA H100 80GB HBM3"})
    with pytest.raises(CompareError, match="different GPU models"):
        compare_records(base, other)


def test_policy_is_respected():
    base = _samples(30, 1.0, 0.005, 1)
    new = _samples(30, 1.03, 0.005, 2)
    assert compare_samples(base, new)[0] == "regression"
    assert compare_samples(base, new, Policy(threshold=0.05))[0] == "same"


def test_cli_compare_exit_codes(tmp_path, capsys):
    base, new = _pair(i0={"median_ms": 1.1})
    same_a, same_b = _pair()
    paths = {}
    for name, rec in (("base", base), ("new", new), ("sa", same_a), ("sb", same_b)):
        paths[name] = str(rec.write(tmp_path / f"{name}.json"))
    assert cli_main(["compare", paths["sa"], paths["sb"]]) == 0
    assert cli_main(["compare", paths["base"], paths["new"], "--json"]) == 1
    out = capsys.readouterr().out
    doc = json.loads(out[out.index("{"):])
    assert doc["regressed"] is True and doc["counts"]["regression"] == 1
    # Input errors: exit 2 with one line naming the problem.
    bad = new.to_dict()
    bad["schema_version"] = 7
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert cli_main(["compare", paths["base"], str(tmp_path / "bad.json")]) == 2
    assert "schema_version: unknown version 7" in capsys.readouterr().err
    other = make_record(specs_for(), gpu={"name": "NVIDIA A100-SXM4-80GB"})
    p_other = str(other.write(tmp_path / "other.json"))
    assert cli_main(["compare", paths["base"], p_other]) == 2
    assert "different GPU models" in capsys.readouterr().err
    assert cli_main(["compare", "1", "2", "--db", str(tmp_path / "none.sqlite")]) == 2
    assert "no database" in capsys.readouterr().err
    assert cli_main(["compare", "1", "2", "--db",
                     "postgresql+psycopg://postgres@127.0.0.1:1/none"]) == 2
    assert "cannot connect" in capsys.readouterr().err


def test_untimed_results_are_not_open_questions_and_fixes_are_shown():
    """A CPU gate compares correctness-only runs: no timing on either side is `same`
    (it listed 168 all-dash `inconclusive` rows), and a case fixed since the baseline is
    shown first among the changes, not cut off behind them."""
    base_specs = specs_for(samples=0)
    new_specs = specs_for(samples=0)
    base_specs[1].status = "failed"
    report = compare_records(make_record(base_specs, seed=1),
                             make_record(new_specs, seed=2, minutes=1))
    counts = report.counts()
    assert "inconclusive" not in counts and counts["correctness_fixed"] == 1
    text = report.markdown()
    assert "| correctness_fixed |" in text and "| inconclusive |" not in text
    # one side timed, the other not: still an open question
    assert compare_samples([], [1.0] * 20)[0] == "inconclusive"


def test_a_verdict_shows_the_clocks_its_timings_ran_at_on_a_real_record():
    # The committed H100 perf record: fa3_wgmma's d128 N2048 bf16 timing ran at 1770 MHz
    # under the chip's power cap. Against itself at 1980 MHz and 10% faster, the slowdown is
    # a regression where the run-to-run history is known and small (the clock is shown, not
    # used to excuse it), with both clocks beside it; with no history, the clock's fall of
    # 10.6% explains it and the verdict is left open (rule 5).
    import copy
    from pathlib import Path

    from harness.records.record import RunRecord

    path = Path(__file__).resolve().parents[1] / "results" / "h100-20261205T072458Z-perf.json"
    new = RunRecord.read(path)
    case = "b8h16-2048x2048-d128-bf16-none"
    entry = next(e for e in new.results if e["kernel"] == "fa3_wgmma" and e["case_id"] == case)
    assert entry["extra"]["sm_clock_mhz"] == 1770.0
    base = copy.deepcopy(new.to_dict())
    base["uuid"] = "00000000-0000-4000-8000-000000000001"
    for e in base["results"]:
        if e["kernel"] == "fa3_wgmma" and e["case_id"] == case:
            e["samples_ms"] = [x / 1.1 for x in e["samples_ms"]]
            e["median_ms"] /= 1.1
            e["extra"]["sm_clock_mhz"] = 1980.0
    alone = compare_records(RunRecord.from_dict(base), new)
    v = next(v for v in alone.verdicts if v.variant == "fa3_wgmma" and v.case_id == case)
    assert v.verdict == "inconclusive" and "1980 -> 1770 MHz" in v.detail["reason"]
    report = compare_records(RunRecord.from_dict(base), new, noise=_quiet_history(new))
    v = next(v for v in report.verdicts if v.variant == "fa3_wgmma" and v.case_id == case)
    assert v.verdict == "regression" and v.detail["run_to_run_spread"] < 0.01
    assert (v.detail["base_clock_mhz"], v.detail["new_clock_mhz"]) == (1980.0, 1770.0)
    row = next(line for line in report.markdown().splitlines() if case in line)
    assert row.startswith("| regression | `fa3_wgmma`") and row.endswith("| 1980 -> 1770 |")
    # Every other pair ran at one clock on both sides: no clock shown, all the same.
    assert {v.verdict for v in report.verdicts if v.case_id != case or
            v.variant != "fa3_wgmma"} == {"same"}


def _quiet_history(rec):
    """A noise model in which every timed (candidate, pass, case) of `rec` was measured in
    four earlier runs of one chip within 0.3% of one another."""
    return _history([rec], factors=(1.0, 1.003, 0.998, 1.001), device="GPU-earlier")


def test_a_runs_own_level_range_needs_its_blocks_to_differ():
    from harness.records.sample_stats import level_range

    rng = np.random.default_rng(5)
    steady = list(1.0 + 0.015 * rng.standard_normal(200))
    assert level_range(steady) == 0.0  # one level: blocks apart by chance only
    by_turns = [x * (1.02 if (i // 50) % 2 == 0 else 1.0) for i, x in
                enumerate(1.0 + 0.002 * rng.standard_normal(200))]
    assert level_range(by_turns) == pytest.approx(math.log(1.02), abs=0.002)
    # Two blocks where four would hold fewer than 5 samples; nothing below 10.
    assert level_range(by_turns[:12], 5) is not None and level_range(by_turns[:9], 5) is None


def test_a_window_of_base_runs_gives_its_median_level_range():
    from harness.records.sample_stats import level_bar

    rng = np.random.default_rng(6)
    steady = [list(1.0 + 0.002 * rng.standard_normal(80)) for _ in range(2)]
    restless = [x * (1.03 if i < 40 else 1.0) for i, x in enumerate(steady[0])]
    # One restless run among three base runs does not set the bar; the new run's does.
    assert level_bar([*steady, restless], steady[1]) == 0.0
    assert level_bar([*steady, restless], restless) == pytest.approx(math.log(1.03), abs=0.002)
    assert level_bar([restless, restless], steady[0]) == pytest.approx(math.log(1.03),
                                                                       abs=0.002)
    assert level_bar([[1.0] * 3], [1.0] * 4) is None  # too few samples anywhere


def _h100_aa_records(runs: str = "h100-20261206T02*-ci-aa*.json",
                     planted: str = "h100-20261206-ci-planted-2pct-fa2_mma-record.json"):
    """Five committed A/A `ci` records of one commit (`runs`, under results/) and the next
    commit's with fa2_mma slowed 2% (`planted`, under tests/data/: not under results/,
    since `fa-harness import results/` would take its slowed fa2_mma into the project's
    history)."""
    from pathlib import Path

    from harness.records.record import RunRecord

    root = Path(__file__).resolve().parents[1] / "results"
    aa = [RunRecord.read(p) for p in sorted(root.glob(runs))]
    return aa, RunRecord.read(Path(__file__).parent / "data" / planted)


def _history(records, *, factors=(1.0,), device=None):
    """The noise model the gate would read from `records` (their passed, timed entries);
    `factors`: each record's medians once per factor, as if timed that much slower in a run
    of its own; `device`: a GPU uuid for all of them instead of each record's."""
    from harness.records.noise import from_rows

    # Each (record, factor) is a run of its own, numbered in order as the database's ids.
    return from_rows([(e["kernel"], (r.kernels.get(e["kernel"]) or {}).get("source_hash", ""),
                       e.get("pass", "fwd"), e["case_id"], e["median_ms"] * f,
                       device or r.gpu.get("uuid", ""), i * len(factors) + j)
                      for i, r in enumerate(records) for j, f in enumerate(factors)
                      for e in r.results
                      if e.get("status") == "passed" and e.get("median_ms")])


def test_a_change_within_a_runs_own_level_range_is_not_called_on_real_h100_runs():
    # Two `ci` runs of one commit on an H100 (2026-12-06): fa2_mma's d128 bf16 causal case
    # sat at two levels 2.6% apart by turns within the second run, and the U test called
    # the 2.1% between the runs' medians certain. Rule 4 holds it: inconclusive, not an
    # improvement; nothing else of the 62 pairs moves.
    aa, _ = _h100_aa_records()
    assert len(aa) == 5
    report = compare_records(aa[0], aa[1])
    case = "b8h16-2048x2048-d128-bf16-causal_br"
    v = next(v for v in report.verdicts if v.variant == "fa2_mma" and v.case_id == case
             and v.pass_name == "fwd")
    assert v.ratio < 0.98 and v.p_value < 1e-20 and v.detail["rules"]["intervals"]
    assert v.verdict == "inconclusive" and not v.detail["rules"]["levels"]
    assert "own level" in v.detail["reason"] and v.detail["level_range"] > math.log(1.02)
    assert report.counts() == {"inconclusive": 1, "same": 61}
    text = report.markdown()
    assert text.splitlines()[-1] == (f"- `fa2_mma` `{case}`: ratio beyond threshold, not "
                                     "confirmed by each run's own level (its quarters up to "
                                     "2.58% apart)")


def test_a_planted_slowdown_against_real_h100_runs_is_the_strongest_evidence_not_yet_red():
    # The next commit with fa2_mma slowed by 2% (bench/plant_slowdown.py), against the five
    # A/A runs as its baseline window and noise history. That run measured the guard as
    # +1.2% on fa2_mma's backward (its forward came out faster), against runs whose
    # backward moved 0.3% as a whole: the strongest evidence of the run (p = 0.007), but
    # not below a bar that keeps 99 of 100 commits that changed nothing green over 8
    # candidate-passes. Not red at this commit; the step search flags it when the next
    # commit holds it.
    aa, planted = _h100_aa_records()
    report = compare_records(aa, planted, noise=_history(aa))
    assert not report.regressed
    strongest = min(report.candidates, key=lambda c: c.p_value)
    assert (strongest.variant, strongest.pass_name) == ("fa2_mma", "bwd")
    assert 1.01 < strongest.ratio < 1.015 and strongest.alpha < strongest.p_value < 0.01


D4E29DB = ("h100-20261206T1[34]*-ci-aa*.json",
           "h100-20261206-ci-planted-2pct-fa2_mma-d4e29db-record.json")


def test_a_change_the_clock_explains_is_left_open_without_history_on_real_h100_runs():
    # Five `ci` runs of d4e29db on one H100 (fa2_mma, fa3_wgmma, the teaching kernels): the
    # second, with the first as its only history, timed fa3_wgmma's d128 N2048 bf16 case
    # 4.7% faster with the SM clock at 1935 MHz instead of 1815, and the samples called it
    # certain. Rule 5 leaves it open; the runs' other verdicts do not move.
    aa, _ = _h100_aa_records(*D4E29DB)
    assert len(aa) == 5 and len({r.gpu["uuid"] for r in aa}) == 1
    report = compare_records(aa[0], aa[1])
    case = "b8h16-2048x2048-d128-bf16-none"
    v = next(v for v in report.verdicts if v.variant == "fa3_wgmma" and v.case_id == case
             and v.pass_name == "fwd")
    assert 0.95 < v.ratio < 0.96 and v.p_value < 1e-50 and all(v.detail["rules"].values())
    assert (v.detail["base_clock_mhz"], v.detail["new_clock_mhz"]) == (1815.0, 1935.0)
    assert v.verdict == "inconclusive" and "1815 -> 1935 MHz" in v.detail["reason"]
    assert not report.regressed and "improvement" not in report.counts()
    # Every later run against the first: nothing flagged.
    for new in aa[2:]:
        counts = compare_records(aa[0], new).counts()
        assert set(counts) <= {"same", "inconclusive"}, counts


def test_a_planted_slowdown_fails_against_five_real_h100_runs_of_one_chip():
    # fa2_mma slowed by 2% in the next commit, judged against the five A/A runs as window
    # and noise history: red on fa2_mma alone, fa3_wgmma's clock-moved cases not. The run
    # measured the planted guard as +1.2% on the backward's four cases (its forward came
    # out faster: the guard's code), each within reach of one case's heavy-tailed noise;
    # the backward as a whole is what is red (harness.records.verdict_stats).
    aa, planted = _h100_aa_records(*D4E29DB)
    report = compare_records(aa, planted, noise=_history(aa))
    bad = [v for v in report.verdicts if v.verdict == "regression"]
    assert report.regressed and len(bad) >= 3 and {v.variant for v in bad} == {"fa2_mma"}
    assert all(1.01 < v.ratio < 1.03 for v in bad)
    whole = next(c for c in report.candidates if (c.variant, c.pass_name) == ("fa2_mma", "bwd"))
    assert whole.verdict == "regression" and 1.01 < whole.ratio < 1.015
    assert all(v.detail["candidate"]["verdict"] == "regression" for v in bad)
