"""The gate's summary says how large a slowdown each of the team's cases had to show to
fail the run (the noise model's thresholds), on the committed H200 records."""

from __future__ import annotations

import realdata

GATE_RUN = realdata.RESULTS / "h200-20261202T075402Z-ci-cold.json"


def test_the_summary_names_what_each_candidate_could_flag(tmp_path, tmp_path_factory):
    from harness.records.compare import compare_records
    from harness.records.db.store import get_run, open_db
    from harness.records.noise import from_db
    from harness.records.record import RunRecord
    from harness.runs import gate
    from harness.runs.gate_summary import summary_markdown

    base = realdata.load(GATE_RUN)
    rec = realdata.derive(base, hours=48, commit="e" * 40, parent=base["commit"])
    # The sample of the committed history (imported once per session: realdata.shared),
    # then the new run.
    url = realdata.fa_import(realdata.copy_db(realdata.shared("sample", tmp_path_factory),
                                           tmp_path), realdata.write([rec], tmp_path / "new"))
    new = RunRecord.from_dict(rec)
    with open_db(url) as db:
        noise = from_db(db, new.gpu_model_key, before_run_id=get_run(db, "latest").id)
    out = gate.GateOutcome(record=new, report=compare_records(
        RunRecord.from_dict(base), new, noise=noise))
    text = summary_markdown(out)
    section = text[text.index("### What a slowdown must pass to fail this run"):]
    rows = {line.split("`")[1]: line for line in section.splitlines() if line.startswith("- `")}
    # The team's candidates, each pass on its own line; the SDPA peers are yardsticks.
    assert {"fa1", "fa2_mma", "template"} <= set(rows) and not any(
        k.startswith("sdpa_") for k in rows), rows
    for line in rows.values():
        n = int(line.split(": ", 1)[1].split(" timed")[0])
        counts = [int(c.split(": ")[1]) for c in
                  line.split("threshold ")[1].split(";")[0].split(", ")]
        assert counts == sorted(counts) and counts[-1] <= n, line  # cumulative
    # template on the 1k-key decode case: runs 2.8% apart, so a slowdown must pass 3
    # spreads there; the summary names it.
    assert "the widest:" in rows["template"] and "b1h32k8-1x1024-d128" in rows["template"]
    widest = float(rows["template"].split("the widest: ")[1].split("%")[0])
    assert widest > 5.0
    print(section)


def test_the_summary_says_when_the_floors_outgrew_the_budget():
    # The cold default gate on an H100 (2026-12-06): the owned candidates' floors alone
    # were estimated at 375 s against the 5-minute budget; the summary says why.
    from harness.records.compare import compare_records
    from harness.records.record import RunRecord
    from harness.runs import gate
    from harness.runs.gate_summary import summary_markdown

    cold = RunRecord.read(realdata.RESULTS / "h100-20261206T025023Z-ci-cold.json")
    plan = cold.env["ci_plan"]
    assert plan["estimate_s"] > plan["budget_s"] == 300
    text = summary_markdown(gate.GateOutcome(record=cold, report=compare_records(cold, cold)))
    line = next(x for x in text.splitlines() if x.startswith("- plan: "))
    assert "estimate 375 s (over the budget: the owned candidates' floors are never cut)" in line
    h200 = RunRecord.read(GATE_RUN)
    assert h200.env["ci_plan"]["estimate_s"] <= h200.env["ci_plan"]["budget_s"]
    text = summary_markdown(gate.GateOutcome(record=h200, report=compare_records(h200, h200)))
    assert "over the budget" not in text
