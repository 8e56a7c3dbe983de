"""Every stored comparison points at the base run it was judged against: when the
baseline pools a window of runs, that is the newest run of the window holding the
candidate, pass and case, not simply the newest run of the window (which may not hold
it: its "base vs new" link then opened two runs with nothing in common). Held on the
committed H200 records, imported the way a user imports them."""

from __future__ import annotations

import realdata
from sqlalchemy import select

from harness.records.db.engine import make_engine
from harness.records.db.models import CaseRow, Comparison, Result, Run, Variant


def test_every_comparison_of_the_committed_records_names_a_base_run_that_holds_it(
        tmp_path_factory):
    # The sample of the committed records (realdata.SAMPLE), imported once per session.
    url = realdata.shared("sample", tmp_path_factory)
    engine = make_engine(url)
    with engine.connect() as conn:
        held = set(conn.execute(
            select(Result.run_id, Variant.name, Result.pass_name, CaseRow.case_id)
            .join(Variant, Variant.id == Result.variant_id)
            .join(CaseRow, CaseRow.id == Result.case_pk)).all())
        comps = conn.execute(select(Comparison.run_id, Comparison.base_run_id,
                                    Comparison.variant, Comparison.pass_name,
                                    Comparison.case_id, Comparison.verdict)
                             .where(Comparison.base_run_id.is_not(None))).all()
        windows = conn.execute(select(Comparison.run_id, Comparison.base_run_id)
                               .distinct()).all()
        n_runs = conn.execute(select(Run.id)).all()
    engine.dispose()
    assert comps and len(n_runs) >= 10
    wrong = [c for c in comps if c.verdict != "new"
             and (c.base_run_id, c.variant, c.pass_name, c.case_id) not in held]
    assert wrong == [], wrong[:5]
    # The pooled windows are there: some run was judged against more than one base run.
    per_run: dict[int, set] = {}
    for run_id, base in windows:
        per_run.setdefault(run_id, set()).add(base)
    assert any(len(b) > 1 for b in per_run.values())
