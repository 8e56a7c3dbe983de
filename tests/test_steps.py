"""Steps across commits (harness.records.steps, PELT through ruptures): a sharp step and
its commit, a step spread over commits, a slow run just before a step, a step little
above the noise, a recovery, no alert on flat noise, and series resampled from the
committed H200 records' run-to-run noise (bench/detection_steps.py)."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.records import step_gate, steps
from harness.records.steps import find_steps

ROOT = Path(__file__).resolve().parents[1]
COMMITS = [f"c{i:02d}" for i in range(30)]


def _series(step_at: dict[int, float], noise: float = 0.002, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    level, out = 1.0, []
    for i in range(len(COMMITS)):
        level *= step_at.get(i, 1.0)
        out.append(level * math.exp(rng.gauss(0.0, noise)))
    return out


def test_a_sharp_step_names_its_commit():
    (st,) = find_steps(COMMITS, _series({15: 1.03}))
    assert (st.last_good, st.first_bad, st.direction) == ("c14", "c15", "regression")
    assert math.isclose(st.ratio, 1.03, rel_tol=0.005) and st.recovered_at is None


def test_sharp_steps_name_their_own_commit_not_a_later_one():
    """The first bad commit maximises the chance of lying at most RANGE commits after
    the step; among commits that all but surely do, the nearest (RANGE_COST) wins."""
    ranges = [[(s.last_good, s.first_bad) for s in find_steps(COMMITS, _series({15: 1.03},
                                                                              seed=seed))]
              for seed in range(40)]
    assert all(len(r) == 1 and r[0][0] <= "c14" and "c15" <= r[0][1] <= "c17"
               for r in ranges), ranges
    assert sum(r == [("c14", "c15")] for r in ranges) >= 35, ranges


def test_a_slow_run_just_before_a_step_widens_its_range_instead_of_moving_it():
    """A gate's cold first run (+5%) just before a 2% step sits nearer the new level than
    the old: named as the first bad commit it would blame a good one. The range covers
    both commits it cannot tell apart, and its first bad commit is the step's."""
    meds = _series({15: 1.02})
    meds[14] *= 1.05
    (st,) = find_steps(COMMITS, meds)
    assert st.first_bad == "c15" and st.last_good <= "c13", st
    assert math.isclose(st.ratio, 1.02, rel_tol=0.005)


def test_a_run_halfway_between_the_levels_is_inside_the_range():
    """Where the step began is uncertain by a commit: the last good commit is one that is
    before it with probability 0.95, not the likelier one."""
    meds = _series({15: 1.02})
    meds[14] *= 1.009
    (st,) = find_steps(COMMITS, meds)
    assert (st.last_good, st.first_bad) == ("c13", "c15"), st


def test_a_two_percent_step_of_two_spreads_is_found_near_the_start_of_a_series():
    """A 2% step at commit 7 of series measured to 1% run to run (Gaussian): the windows'
    medians and the U test find it where a bar of 1.5 spreads on the step, or the penalty
    of twice the BIC's, lost one in six of these (39 and 35 of 60)."""
    hits = 0
    for seed in range(60):
        found = find_steps(COMMITS, _series({7: 1.02}, noise=0.01, seed=seed))
        hits += any(s.direction == "regression" and "c07" <= s.first_bad <= "c09"
                    and s.last_good < "c09" for s in found)
    assert hits >= 45, hits


def test_a_short_excursion_is_cut_and_rejected_with_its_rule():
    meds = _series({})
    meds[10] *= 1.03
    meds[11] *= 1.03
    rejected: list[tuple[int, str]] = []
    assert find_steps(COMMITS, meds, rejected=rejected) == []
    assert rejected and all(rule == "below 1%" for _, rule in rejected), rejected


def test_a_step_spread_over_three_commits_is_found_as_one():
    found = find_steps(COMMITS, _series({14: 1.007, 15: 1.007, 16: 1.007}))
    assert len(found) == 1, found
    st = found[0]
    assert st.direction == "regression" and math.isclose(st.ratio, 1.021, rel_tol=0.006)
    assert "c13" <= st.last_good < st.first_bad <= "c17"


def test_a_recovery_is_marked():
    found = find_steps(COMMITS, _series({10: 1.05, 20: 1 / 1.05}))
    assert [s.direction for s in found] == ["regression", "improvement"]
    assert found[0].recovered_at == "c20"


def test_flat_noise_raises_no_alert_and_short_series_none():
    alerts = sum(len(find_steps(COMMITS, _series({}, noise=0.005, seed=s))) for s in range(50))
    assert alerts <= 1
    # Gaussian noise of 1% per run: at most 0.4% false alerts per commit (0.3% measured)
    alerts = sum(len(find_steps(COMMITS, _series({}, noise=0.01, seed=s))) for s in range(100))
    assert alerts <= 12, alerts
    assert find_steps(COMMITS[:3], [1.0, 1.1, 1.2]) == []


def test_the_detection_benchmark_on_the_committed_noise():
    """bench/detection_steps.py on the committed records (few trials: it is a benchmark,
    this only keeps it running and its A/A rows quiet)."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "detection_steps.py"),
                           "--trials", "40", "--per-candidate"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.startswith("| ")]
    aa = [r for r in rows if r[3].strip() == "0%"]
    assert aa and all(float(r[5].strip().rstrip("%")) <= 1.0 for r in aa), proc.stdout
    assert any("per candidate" in r[1] and r[3].strip() == "2%" for r in rows), proc.stdout


def _cases(n: int, noise: float, step_at: int, step: float, seed: int
           ) -> dict[tuple[str, str, str], list[tuple[str, float]]]:
    """n cases of one candidate over COMMITS[:24], each with its own level and noise, all
    `step` slower from commit `step_at` on (a change to the kernel moves every case)."""
    rng = random.Random(seed)
    return {("k", "fwd", f"case{i}"): [
        (c, (1 + 0.1 * i) * math.exp(rng.gauss(0.0, noise)) * (step if j >= step_at else 1))
        for j, c in enumerate(COMMITS[:24])] for i in range(n)}


def test_a_whole_kernel_step_that_each_cases_noise_hides_is_named_by_their_mean():
    from harness.records.step_gate import confirmed_steps
    from harness.records.steps import ALL_CASES, candidate_series

    series = _cases(12, noise=0.012, step_at=21, step=1.02, seed=5)
    named = [st for pts in series.values()
             for st in find_steps([c for c, _ in pts], [m for _, m in pts])
             if st.first_bad == "c21"]
    assert len(named) < 12  # one case's 1.2% noise: not every case names the commit
    mean = candidate_series(series)[("k", "fwd", ALL_CASES)]
    assert [c for c, _ in mean] == COMMITS[:24]
    (st,) = find_steps([c for c, _ in mean], [m for _, m in mean])
    assert (st.last_good, st.first_bad) == ("c20", "c21")
    assert math.isclose(st.ratio, 1.02, rel_tol=0.005)
    # c23 holds the new level 3 commits: confirmed, for the candidate as a whole.
    assert confirmed_steps(series, "c23")[("k", "fwd", ALL_CASES)].first_bad == "c21"
    # Fewer than MIN_CASES cases at a commit: no mean there; no mean of one case.
    assert candidate_series(dict(list(series.items())[:1])) == {}
    # Cases of an old grid until c11, of a new one from c12: nothing orders the two sets'
    # commits against each other, so the mean keeps the newest stretch only.
    split = {(n, p, c + ("" if i % 2 else "-new")): pts[:12] if i % 2 else pts[12:]
             for i, ((n, p, c), pts) in enumerate(series.items())}
    for newest, span in (("c23", COMMITS[12:24]), ("c11", COMMITS[:12]), ("c05", [])):
        got = candidate_series(split, newest=newest).get(("k", "fwd", ALL_CASES), [])
        assert [c for c, _ in got] == span


def test_a_candidate_step_marks_its_slower_cases_or_else_its_slowest():
    from harness.records.compare import Report, Verdict
    from harness.records.step_gate import apply_steps
    from harness.records.steps import ALL_CASES, Step

    st = Step(index=21, last_good="c20", first_bad="c21", ratio=1.02, sigma=0.004)
    vs = [Verdict("k", "a", "same", ratio=1.01), Verdict("k", "b", "same", ratio=0.995),
          Verdict("k", "c", "improvement", ratio=1.004), Verdict("other", "a", "same", 1.03)]
    report = Report("base", "new", "nvidia-h200", vs)
    assert apply_steps(report, {("k", "fwd", ALL_CASES): st}) == 2
    assert [v.verdict for v in vs] == ["regression", "same", "regression", "same"]
    assert vs[0].detail["step"]["whole_candidate"] and vs[0].ratio == 1.01
    assert "mean of the candidate's cases" in vs[0].detail["reason"]
    faster = [Verdict("k", "a", "same", ratio=0.99), Verdict("k", "b", "same", ratio=0.995)]
    assert apply_steps(Report("b", "n", "nvidia-h200", faster),
                       {("k", "fwd", ALL_CASES): st}) == 1
    assert [v.verdict for v in faster] == ["same", "regression"]


def test_the_gate_flags_a_slowdown_spread_over_small_commits(tmp_path):
    """Ten runs of the committed perf record (fa2_mma and a peer) at ten commits, fa2_mma
    (owned) 0.7% slower at each of three of them: no pairwise comparison calls 0.7% a
    regression, the step across commits (2.1%, confirmed by the two commits after it)
    does."""
    import realdata

    from harness.records.compare import compare_records
    from harness.records.db.store import get_run, load_record, open_db
    from harness.records.record import RunRecord
    from harness.runs import gate

    perf = _fa2_mma_perf()
    perf["kernels"]["fa2_mma"] = dict(perf["kernels"].get("fa2_mma") or {}, owned=True)
    recs, factor = [], 1.0
    for i in range(10):
        if i in (5, 6, 7):
            factor *= 1.007
        r = realdata.derive(perf, hours=i, commit=f"{i:040x}", parent=f"{i - 1:040x}")
        realdata.slower(r, "fa2_mma", factor)
        recs.append(r)
    url = realdata.fa_import(f"sqlite:///{tmp_path / 'r.sqlite'}",
                             realdata.write(recs, tmp_path / "recs"))
    # `fa-harness import` judged the runs as they were stored: the step is flagged at one
    # commit, the first that confirms it, and not again at the commits after it.
    import sqlite3

    con = sqlite3.connect(url.removeprefix("sqlite:///"))
    stored = con.execute("SELECT r.\"commit\", c.verdict, c.detail FROM comparisons c JOIN runs r"
                         " ON r.id = c.run_id WHERE c.variant = 'fa2_mma'").fetchall()
    con.close()
    red = sorted({c for c, v, _ in stored if v == "regression"})
    assert len(red) == 1 and f"{7:040x}" <= red[0], red
    stepped = [r for r in stored if r[0] == red[0] and '"step"' in (r[2] or "")]
    assert stepped and all(r[1] == "regression" for r in stepped)
    _forget_verdicts(url)
    with open_db(url) as db:
        last = get_run(db, "latest")
        new = RunRecord.from_dict(recs[-1])  # the gate's own record: it knows what is owned
        assert load_record(db, last.id).uuid == new.uuid
        prev = RunRecord.from_dict(recs[-2])
        out = gate.GateOutcome(record=new, run_id=last.id,
                               report=compare_records(prev, new))
        fa2 = [v for v in out.report.verdicts if v.variant == "fa2_mma" and v.ratio]
        assert fa2 and all(v.verdict != "regression" for v in fa2)  # pairwise: nothing
        gate._steps(db, out, new)
    flagged = [v for v in out.report.verdicts if v.variant == "fa2_mma"
               and v.verdict == "regression"]
    assert len(flagged) >= 0.9 * len(fa2), [v.detail.get("reason") for v in fa2][:3]
    st = flagged[0].detail["step"]
    assert math.isclose(st["ratio"], 1.007 ** 3, rel_tol=0.003)
    assert f"{4:040x}" <= st["last_good"] < st["first_bad"] <= f"{7:040x}"
    assert "step(s) across commits" in out.notes[-1]
    others = [v for v in out.report.verdicts if v.variant != "fa2_mma"]
    assert all(v.verdict != "regression" or "step" not in v.detail for v in others)


def test_the_gate_flags_a_whole_kernel_step_hidden_in_per_case_noise(tmp_path):
    """Twelve runs of the committed perf record at twelve commits, each of fa2_mma's
    cases with 1.2% noise of its own per run, and all of them 2% slower from the tenth
    commit on: the mean over its cases names the step's commit, and the gate marks the
    slower cases of the newest run as regressions of the whole candidate."""
    out = _gate_on_noisy_runs(tmp_path, seed=11, noise=0.012,
                              factor=lambda i: 1.02 if i >= 9 else 1.0)
    whole = [v for v in out.report.verdicts
             if v.detail.get("step", {}).get("whole_candidate")]
    assert whole and all(v.variant == "fa2_mma" and v.verdict == "regression" for v in whole)
    st = whole[0].detail["step"]
    assert (st["last_good"], st["first_bad"]) == (f"{8:040x}", f"{9:040x}")
    assert math.isclose(st["ratio"], 1.02, rel_tol=0.01)


def test_a_source_change_names_the_commit_a_slow_run_before_it_would_blur():
    """A run halfway between the levels just before a step: without knowing where the
    candidate's source changed, the range covers both commits; told that only c15
    changed it, the range is that commit alone. A clear step at a commit whose source did not change (the runner,
    the driver) is still found where the runs put it: the prior weighs, it does not
    decide."""
    from harness.records.steps import source_changes

    meds = _series({15: 1.02})
    meds[14] *= 1.009
    changed = [i == 15 for i in range(len(COMMITS))]
    (blind,) = find_steps(COMMITS, meds)
    (told,) = find_steps(COMMITS, meds, changed=changed)
    assert (blind.last_good, blind.first_bad) == ("c13", "c15"), blind
    assert (told.last_good, told.first_bad) == ("c14", "c15"), told
    (env,) = find_steps(COMMITS, _series({15: 1.03}), changed=[i == 22 for i in range(30)])
    assert (env.last_good, env.first_bad) == ("c14", "c15"), env
    # Unknown hashes ("" in records before source hashes) are no evidence either way.
    assert source_changes(["a", "b", "c", "d"], {"a": "h1", "b": "h1", "c": "", "d": "h2"}) \
        == [True, False, True, True]
    assert source_changes(["a"], None) is None
    with pytest.raises(ValueError, match="29 source flags for 30 commits"):
        find_steps(COMMITS, meds, changed=changed[1:])


def test_the_gate_reads_where_the_source_changed_from_the_stored_records(tmp_path):
    """Twelve runs of the committed perf record, fa2_mma 2% slower with a new source hash
    from the tenth commit on, and the ninth run of it 1.2% slow (the noise of one run):
    told by the stored hashes, the gate names the tenth commit as the first bad one of
    every case and, for many of them, the ninth as the last good (13 of 48 cases; the
    others keep the eighth too: that run lies nearer the new level); without the hash
    change, none."""
    def named(hash_changes: bool, where: Path) -> list[tuple[str, str]]:
        out = _gate_on_noisy_runs(where, seed=5, noise=0.003,
                                  factor=lambda i: (1.02 if i >= 9 else 1.0) *
                                  (1.012 if i == 8 else 1.0),
                                  new_hash_from=9 if hash_changes else None)
        steps = [(v.detail["step"]["last_good"], v.detail["step"]["first_bad"])
                 for v in out.report.verdicts if v.variant == "fa2_mma" and "step" in v.detail]
        assert steps, [v.detail.get("reason") for v in out.report.verdicts][:3]
        return steps

    (tmp_path / "told").mkdir()
    (tmp_path / "blind").mkdir()
    exact = (f"{8:040x}", f"{9:040x}")
    told, blind = named(True, tmp_path / "told"), named(False, tmp_path / "blind")
    assert all(first_bad == exact[1] for _, first_bad in told), told
    assert sum(r == exact for r in told) >= sum(r == exact for r in blind) + 10, (told, blind)


def _fa2_mma_perf() -> dict[str, Any]:
    """The newest committed H200 perf record that times fa2_mma, with fa2_mma's results
    and SDPA flash's (a yardstick beside it) only: the other kernels add nothing to what
    these tests judge but their import time."""
    import realdata

    perf = next(rec for rec in map(realdata.load, sorted((ROOT / "results").glob(
        "h200-*-perf.json"), reverse=True)) if "fa2_mma" in rec["kernels"])
    keep = {"fa2_mma", "sdpa_flash"}
    perf["results"] = [e for e in perf["results"] if e["kernel"] in keep]
    perf["kernels"] = {k: v for k, v in perf["kernels"].items() if k in keep}
    return perf


def _forget_verdicts(url: str) -> None:
    """As if no gate had run at the earlier commits: the step search at the newest one
    then reports what it finds (a step an earlier stored verdict flagged is reported
    once, there: step_gate.unreported)."""
    import sqlite3

    con = sqlite3.connect(url.removeprefix("sqlite:///"))
    with con:
        con.execute("DELETE FROM comparisons")
    con.close()


def _gate_on_noisy_runs(where: Path, *, seed: int, noise: float, factor: Any,
                        new_hash_from: int | None = None) -> Any:
    """Twelve runs of the newest committed perf record timing fa2_mma (owned) at twelve
    commits, each of its cases with `noise` of its own per run times `factor(i)`, its
    source hash changed from run `new_hash_from` on; imported, then the gate's step search
    on the newest run against the one before. Returns the gate's outcome."""
    import realdata

    from harness.records.compare import compare_records
    from harness.records.db.store import get_run, open_db
    from harness.records.record import RunRecord
    from harness.runs import gate

    perf = _fa2_mma_perf()
    perf["kernels"]["fa2_mma"] = dict(perf["kernels"].get("fa2_mma") or {}, owned=True,
                                      source_hash="a" * 16)
    rng = random.Random(seed)
    recs = []
    for i in range(12):
        r = realdata.derive(perf, hours=i, commit=f"{i:040x}", parent=f"{i - 1:040x}")
        if new_hash_from is not None and i >= new_hash_from:
            r["kernels"]["fa2_mma"] = dict(r["kernels"]["fa2_mma"], source_hash="b" * 16)
        for e in r["results"]:
            if e["kernel"] == "fa2_mma" and e.get("median_ms") is not None:
                f = math.exp(rng.gauss(0.0, noise)) * factor(i)
                for key in ("median_ms", "min_ms", "iqr_ms"):
                    if e.get(key) is not None:
                        e[key] *= f
                e["samples_ms"] = [s * f for s in e.get("samples_ms") or []]
        recs.append(r)
    url = realdata.fa_import(f"sqlite:///{where / 'r.sqlite'}",
                             realdata.write(recs, where / "recs"))
    _forget_verdicts(url)
    with open_db(url) as db:
        new, prev = RunRecord.from_dict(recs[-1]), RunRecord.from_dict(recs[-2])
        out = gate.GateOutcome(record=new, run_id=get_run(db, "latest").id,
                               report=compare_records(prev, new))
        gate._steps(db, out, new)
    return out


def test_across_chips_a_step_must_hold_a_third_commit():
    """Two runs in a row on slow chips look like a confirmed step; where the points ran on
    several chips a step is a regression only once a third commit holds the new level
    (harness.records.step_gate._points_needed). On one chip two are enough."""
    from harness.records.step_gate import CONFIRM_POINTS_ACROSS, confirmed_steps

    meds = _series({}, seed=3)
    meds[-2] *= 1.05  # two chips 5% slow, the last two runs (one case: a 4% floor across chips)
    meds[-1] *= 1.05
    series = {("k", "fwd", "c"): list(zip(COMMITS, meds, strict=True))}
    one = {("k", "fwd"): dict.fromkeys(COMMITS, "GPU-a")}
    many = {("k", "fwd"): {c: f"GPU-{i}" for i, c in enumerate(COMMITS)}}
    assert ("k", "fwd", "c") in confirmed_steps(series, COMMITS[-1], chips=one)
    assert ("k", "fwd", "c") in confirmed_steps(series, COMMITS[-1])  # chips unknown: as before
    assert confirmed_steps(series, COMMITS[-1], chips=many) == {}
    # A real step held by three commits is confirmed across chips too.
    assert CONFIRM_POINTS_ACROSS == 3
    meds[-3] *= 1.05
    series = {("k", "fwd", "c"): list(zip(COMMITS, meds, strict=True))}
    assert ("k", "fwd", "c") in confirmed_steps(series, COMMITS[-1], chips=many)


def test_two_runs_at_a_new_level_must_stand_clear_of_their_noise():
    """A step the gate calls from two commits at the new level must be CONFIRM_K standard
    errors of their mean: the 1.8% step of a 2-case candidate's mean at a 0.94% spread that
    turned a no-op commit red (bench/gate_verdicts.py, band 0.5-1.5%) waits for a third
    commit; a 3% one does not."""
    small = steps.Step(index=10, last_good="a", first_bad="b", ratio=1.018, sigma=0.0094)
    assert not step_gate._held_enough(small, 2)
    assert step_gate._held_enough(small, 3)
    big = steps.Step(index=10, last_good="a", first_bad="b", ratio=1.03, sigma=0.0094)
    assert step_gate._held_enough(big, 2)


def test_across_chips_every_commit_at_the_new_level_must_have_moved():
    """Two slow chips among three commits are not a step across chips (one chip runs a
    case 5% slow in 2% of the committed cross-chip residuals); three are."""
    level = [1.0 + 0.002 * ((i * 7) % 5 - 2) for i in range(20)]
    two_of_three = level + [1.05, 1.0, 1.05]
    three = level + [1.05, 1.049, 1.051]
    st = steps.Step(index=20, last_good="c19", first_bad="c20", ratio=1.05, sigma=0.003)
    assert not step_gate._every_point_moved(two_of_three, 20, st)
    assert step_gate._every_point_moved(three, 20, st)


def test_across_chips_a_step_of_one_case_must_be_larger():
    """A 2.5% step of one case held by three commits is a step on one chip, not across
    chips (CASE_STEP_MIN_ACROSS); a 5% one is both."""
    small = steps.Step(index=20, last_good="a", first_bad="b", ratio=1.025, sigma=0.004)
    assert step_gate._case_sized(small) and not step_gate._case_sized(small, across=True)
    five = steps.Step(index=20, last_good="a", first_bad="b", ratio=1.05, sigma=0.004)
    assert step_gate._case_sized(five, across=True)


def test_a_step_held_by_the_newest_two_commits_is_not_put_to_the_u_test_at_the_gate():
    """Fifteen commits at 0.8% noise, one of them a 7% slow run, then two at +5%: the U
    test between 15 points and 2 cannot reach p = 0.02 once one earlier point lies above
    them, so the search alone rejects the step; the gate's search (tail = 2) keeps it for
    step_gate._held_enough to weigh, and calls it a regression of that case."""
    from harness.records.step_gate import _confirmed

    rng = random.Random(3)
    meds = [math.exp(rng.gauss(0.0, 0.008)) for _ in range(15)]
    meds[6] = 1.07
    meds += [1.05, 1.052]
    names = [f"c{i}" for i in range(len(meds))]
    rejected: list[tuple[int, str]] = []
    assert find_steps(names, meds, rejected=rejected) == [] and rejected == [(15, "U test")]
    (st,) = find_steps(names, meds, tail=2)
    assert (st.last_good, st.first_bad) == ("c14", "c15")
    assert math.isclose(st.ratio, 1.05, rel_tol=0.005)
    confirmed = _confirmed(names, meds, None)
    assert confirmed is not None and confirmed.first_bad == "c15"
    # A third commit back at the old level: the tail is no longer the new level's.
    assert _confirmed([*names, "c17"], [*meds, 1.0], None) is None
