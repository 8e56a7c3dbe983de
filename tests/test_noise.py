"""The run-to-run noise model (harness.records.noise): a timing verdict must stand out
against the spread of earlier runs' medians, not only against one run's samples; with
too little history the verdict says so. Held on the committed H200 records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import realdata

from harness.records import noise

sql = realdata.sql
RESULTS = Path(__file__).resolve().parents[1] / "results"


def test_spread_is_robust_and_needs_history():
    assert noise.relative_spread([1.0, 1.0]) is None  # 2 < MIN_HISTORY
    assert noise.relative_spread([1.0, 1.0, 1.0, 1.0]) == 0.0
    jitter = [1.0, 1.01, 0.99, 1.0, 1.01, 0.99, 1.0]
    s = noise.relative_spread(jitter)
    assert 0.005 < s < 0.02
    # A step in the history (a real regression long ago) hardly moves it.
    stepped = jitter + [1.2 * x for x in jitter]
    assert noise.relative_spread(stepped) == pytest.approx(s, rel=0.5)


def test_judge_within_and_beyond_the_noise():
    d: dict = {}
    assert noise.judge("regression", 1.023, 0.0276, 5, d) == "same"
    assert "within the run-to-run noise" in d["reason"] and d["run_to_run_spread"] == 0.0276
    d = {}
    assert noise.judge("regression", 1.10, 0.0028, 5, d) == "regression"
    d = {}
    assert noise.judge("regression", 1.10, None, 1, d) == "regression"
    assert d["history"].startswith("insufficient history (1 A/A pair(s)")
    assert noise.judge("correctness_regression", None, 0.01, 5, {}) == "correctness_regression"


def _verdicts(url: str) -> list[tuple]:
    import sqlite3

    con = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return con.execute(
            'SELECT r."commit", c.variant, c.case_id, c.verdict, c.ratio, c.detail '
            "FROM comparisons c JOIN runs r ON r.id = c.run_id").fetchall()
    finally:
        con.close()


def test_the_committed_fa1_wobble_is_noise_and_a_planted_step_is_not(tmp_path,
                                                                     tmp_path_factory):
    """The sample of the committed records imported (realdata.SAMPLE): fa1's +2.3% at p ~ 1e-77 on the decode case
    (its medians wander by ~3% across unchanged commits) is "same" once three earlier
    runs show that spread; then a run of the newest perf record with fa2_mma 10% slower:
    flagged."""
    url = realdata.copy_db(realdata.shared("sample", tmp_path_factory), tmp_path)
    rows = _verdicts(url)
    fa1 = [r for r in rows if r[1] == "fa1" and r[2] == "b1h32k8-1x1024-d128-bf16-none"
           and r[4] and abs(r[4] - 1) > 0.02]
    seen = [r for r in fa1 if "run_to_run_spread" in json.loads(r[5])]
    assert seen and all(r[3] == "same" for r in seen), fa1
    assert all("within the run-to-run noise" in json.loads(r[5])["reason"] for r in seen)
    # The others, judged before the spread was known (or against a run of their own
    # commit), are not red either.
    assert all(r[3] == "same" for r in fa1 if r not in seen), fa1
    # The newest committed perf record that times fa2_mma (a perf record may hold others).
    perf = next(rec for rec in map(realdata.load, sorted(RESULTS.glob("h200-*-perf.json"),
                                                          reverse=True))
                if "fa2_mma" in rec["kernels"])
    rec = realdata.derive(perf, hours=48, commit="f" * 40, parent=perf["commit"])
    realdata.slower(rec, "fa2_mma", 1.10)
    realdata.fa_import(url, realdata.write([rec], tmp_path / "planted"))
    planted = [r for r in _verdicts(url) if r[0] == "f" * 40 and r[1] == "fa2_mma"]
    flagged = [r for r in planted if r[3] == "regression"]
    assert planted and flagged
    assert len(flagged) >= 0.9 * len([r for r in planted if r[4]]), planted[:3]
    assert all(math.isclose(r[4], 1.10, rel_tol=0.02) for r in flagged)


def test_the_model_reads_earlier_runs_and_pairs_only_one_source(tmp_path_factory):
    from harness.records.db.store import get_run, open_db

    url = realdata.shared("sample", tmp_path_factory)
    with open_db(url) as db:
        last = get_run(db, "latest").id
        m = noise.from_db(db, "nvidia-h200", before_run_id=last)
    key = next(k for k in m.points if k[0] == "fa2_mma")
    assert m.points[key] and all(src for src, _, _ in m.points[key])
    assert all(dev.startswith("GPU-") for _, _, dev in m.points[key])  # the chips' uuids
    # A/A pairs: consecutive runs at one source; a changed source breaks the chain but
    # its spread still judges the new source (the noise is the measurement's).
    model = noise.NoiseModel()
    for src, med in (("a", 1.0), ("a", 1.01), ("b", 2.0), ("b", 2.02), ("b", 2.0)):
        model.add(("k", "fwd", "c"), src, med)
    assert model.history(("k", "fwd", "c")) == 3
    assert model.spread(("k", "fwd", "c")) == pytest.approx(
        1.4826 * math.log(1.01) / math.sqrt(2), rel=0.01)


def test_the_threshold_follows_the_history():
    """No spread yet: 5%; a short history only raises the 2% bar; a trusted quiet one
    lowers it to 1%."""
    key = ("k", "fwd", "c")
    short, quiet, noisy = noise.NoiseModel(), noise.NoiseModel(), noise.NoiseModel()
    assert short.threshold(key, 0.02) == noise.NO_HISTORY_CHANGE == 0.05
    for i in range(3):
        short.add(key, "s", 1.0 + 0.001 * (i % 2))
    assert short.threshold(key, 0.02) == 0.02  # 2 pairs: not trusted below 2%
    for i in range(6):
        quiet.add(key, "s", 1.0 + 0.001 * (i % 2))
        noisy.add(key, "s", 1.0 + 0.03 * (i % 2))
    assert quiet.threshold(key, 0.02) == noise.MIN_CHANGE
    assert noisy.threshold(key, 0.02) > 0.05  # 3 spreads of a 3% wobble


def test_pairs_of_one_chip_and_across_chips():
    """Four runs on one chip agree within 0.2%; across chips the same source lands 3%
    apart: a comparison across chips is judged by the cross-chip pairs, one on the same
    chip by its chip's (module doc of harness.records.noise)."""
    key = ("fa1", "fwd", "c")
    model = noise.NoiseModel()
    for dev, med in (("A", 0.522), ("B", 0.537), ("C", 0.523), ("D", 0.538), ("D", 0.539),
                     ("D", 0.538), ("D", 0.539), ("E", 0.523)):
        model.add(key, "s", med, dev)
    assert model.history(key, False) == 3 and model.history(key, True) == 4
    assert model.spread(key, False) < 0.002 < 0.01 < model.spread(key, True)
    assert model.threshold(key, 0.02, False) == 0.02 < 0.08 < model.threshold(key, 0.02, True)
    d: dict = {}
    assert noise.judge("regression", 1.031, model.spread(key, True), 4, d,
                       across=True) == "same"
    assert d["spread_of"] == "runs across GPUs"
    # On one chip a 3% change stands out against the chip's own 0.2%.
    assert noise.judge("regression", 1.031, model.spread(key, False), 3, {},
                       across=False) == "regression"
    # Too few cross-chip pairs: no spread across chips, and the verdict says so.
    few = noise.NoiseModel()
    for dev, med in (("A", 1.0), ("A", 1.001), ("A", 1.0), ("B", 1.03)):
        few.add(key, "s", med, dev)
    assert few.spread(key, True) is None and few.spread(key, False) is not None
    d = {}
    assert noise.judge("regression", 1.03, None, 1, d, across=True) == "regression"
    assert "across GPUs" in d["history"]


def test_the_range_a_source_measured_on_other_chips():
    """An unchanged source that measured 0.49 ms on three chips and 0.64 on a fourth is
    "same" at 0.645 ms; a changed source has no range, one chip's runs give none, and a
    median beyond the range is still judged."""
    key = ("flex_attention", "fwd", "c")
    model = noise.NoiseModel()
    for dev, med in (("A", 0.644), ("B", 0.492), ("B", 0.4935), ("C", 0.4885)):
        model.add(key, "s", med, dev)
    seen = model.seen_range(key, "s")
    assert seen == (0.4885, 0.644) and model.seen_range(key, "other") is None
    d: dict = {}
    assert noise.judge("regression", 1.33, 0.002, 3, d, seen=seen, new_median=0.645) == "same"
    assert d["seen_range_ms"] == [0.4885, 0.644] and "did not change" in d["reason"]
    assert noise.judge("regression", 1.5, 0.002, 3, {}, seen=seen,
                       new_median=0.74) == "regression"
    one = noise.NoiseModel()
    for med in (0.49, 0.64, 0.49):
        one.add(key, "s", med, "A")
    assert one.seen_range(key, "s") is None
    # Correctness verdicts are never waved through by a range.
    assert noise.judge("correctness_regression", 1.0, 0.002, 3, {}, seen=seen,
                       new_median=0.5) == "correctness_regression"


def test_runs_that_did_not_time_a_case_leave_its_history_alone(tmp_path_factory):
    """The sample of the committed records ends with five backward and perf runs that time
    no decode case: the noise model and the step search still see the gate runs' history
    of template's decode case (counted per series, not per stored run). Counting the last
    five runs of any kind would have seen none of its runs."""
    from harness.records.db.store import get_run, open_db
    from harness.records.step_gate import history_from_db

    key = ("template", "fwd", "b1h32k8-1x1024-d128-fp16-none")
    timed = [realdata.load(p) for p in realdata.SAMPLE if p.name.startswith("h200-")]
    timed = sorted((r["created_at"], r["commit"]) for r in timed
                   if any(e["kernel"] == key[0] and e["case_id"] == key[2] and e["median_ms"]
                          for e in r["results"]))
    url = realdata.shared("sample", tmp_path_factory)
    with open_db(url) as db:
        last = get_run(db, "latest").id
        after = sql(url, "SELECT count(*) FROM runs WHERE gpu_model_key = 'nvidia-h200' "
                         "AND created_at > :t", t=timed[-1][0].replace("T", " ").rstrip("Z"))
        assert after[0][0] >= 5
        m = noise.from_db(db, "nvidia-h200", before_run_id=last, runs=5)
        series, _ = history_from_db(db, "nvidia-h200", upto_run_id=last,
                                    kernels=["template"])
        assert len(m.points[key]) == len(timed) == 5 and m.spread(key) is not None
        assert m.spread(key) > 0.015  # its runs sit at levels 2.7% apart
        # One median per commit: two of the runs shared one.
        assert len(series[key]) == len({c for _, c in timed}) == 4
        # Still the last `runs` of the series at most.
        short = noise.from_db(db, "nvidia-h200", before_run_id=last, runs=3)
        assert len(short.points[key]) == 3
        assert [p[1] for p in short.points[key]] == [p[1] for p in m.points[key][-3:]]


def test_across_chips_without_history_one_case_alone_is_a_chip():
    """Across chips with no run-to-run history a case's flag stands only where its
    candidate's other cases moved past the bar too (noise.whole_candidate_only); on one
    chip, or for a whole-candidate change, the flag stays."""
    from harness.records.compare import Verdict

    def run(ratios: list[float], across: bool | None) -> list[str]:
        vs = [Verdict("k", f"c{i}", "regression" if r > 1.05 else "same", ratio=r,
                      detail={"history": "insufficient history", "threshold": 0.05}
                      if r > 1.05 else {}) for i, r in enumerate(ratios)]
        noise.whole_candidate_only(vs, lambda _k: across)
        return [v.verdict for v in vs]

    chip = [1.30, 1.001, 0.998, 1.002]  # one case 30% slower on another chip
    assert run(chip, True) == ["inconclusive", "same", "same", "same"]
    assert run(chip, False) == ["regression", "same", "same", "same"]
    assert run(chip, None) == ["regression", "same", "same", "same"]
    whole = [1.08, 1.07, 1.06, 1.09]  # the kernel 7% slower: every case moved
    assert run(whole, True) == ["regression"] * 4
    assert run([1.30], True) == ["regression"]  # nothing to tell it by
