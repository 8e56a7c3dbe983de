"""Steps across commits (harness.records.steps, PELT through ruptures): a sharp step and
its commit, a step spread over commits, a recovery, no alert on flat noise, and series
resampled from the committed H200 records' run-to-run noise (bench/detection_steps.py)."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path

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
    assert find_steps(COMMITS[:3], [1.0, 1.1, 1.2]) == []


def test_the_detection_benchmark_on_the_committed_noise():
    """bench/detection_steps.py on the committed records (few trials: it is a benchmark,
    this only keeps it running and its A/A rows quiet)."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "detection_steps.py"),
                           "--trials", "40"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.startswith("| ")]
    aa = [r for r in rows if r[3].strip() == "0%"]
    assert aa and all(float(r[5].strip().rstrip("%")) <= 1.0 for r in aa), proc.stdout


def test_the_gate_flags_a_slowdown_spread_over_small_commits(tmp_path):
    """Ten runs of the committed perf record at ten commits, fa2_mma (owned) 0.7% slower
    at each of three of them: no pairwise comparison calls 0.7% a regression, the step
    across commits (2.1%, confirmed by the two commits after it) does."""
    import realdata

    from harness.records import gate
    from harness.records.compare import compare_records
    from harness.records.db.store import get_run, load_record, open_db
    from harness.records.record import RunRecord

    perf = realdata.load(sorted((ROOT / "results").glob("h200-*-perf.json"))[-1])
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
    # `fa-harness import` judged the same runs as they were stored: the step is there too.
    import sqlite3

    con = sqlite3.connect(url.removeprefix("sqlite:///"))
    stored = con.execute("SELECT variant, verdict, detail FROM comparisons WHERE run_id = ?",
                         (last.id,)).fetchall()
    con.close()
    stepped = [r for r in stored if r[0] == "fa2_mma" and '"step"' in (r[2] or "")]
    assert stepped and all(r[1] == "regression" for r in stepped)
    assert len(stepped) >= 0.9 * len(fa2)
