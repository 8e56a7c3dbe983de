"""Many writers at once, on SQLite and on the PostgreSQL server named by
FA_HARNESS_TEST_PG: 8 processes open a brand-new database together (racing on the schema
migration) and store records that share kernels and cases, plus one record they all
store: no lost and no duplicated rows."""

from __future__ import annotations

import multiprocessing as mp

import pytest
from sqlalchemy import func, select

from harness.records.db.models import CaseRow, Result, Run, Variant
from harness.records.db.store import counts, open_db, store_record
from harness.records.synthetic import Spec, make_record, specs_for

WRITERS = 8
RECORDS_PER_WRITER = 3


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def fresh_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.sqlite'}"
    return request.getfixturevalue("pg_url")


def _writer(url: str, worker: int, start: mp.synchronize.Event, q: mp.Queue) -> None:
    try:
        start.wait(30)
        db = open_db(url)  # all writers race on creating the schema
        ids = []
        shared = specs_for()  # same kernels and cases for everyone
        for i in range(RECORDS_PER_WRITER):
            own = [Spec(f"k_{worker}", shared[0].case), Spec("k_shared_new", shared[1].case)]
            rec = make_record(shared + own, seed=worker * 100 + i, minutes=worker * 10 + i)
            ids.append(store_record(db, rec))
        ids.append(store_record(db, make_record(shared, seed=424242)))  # the common record
        db.close()
        q.put((worker, ids, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent test
        q.put((worker, [], f"{type(exc).__name__}: {exc}"))


def test_eight_concurrent_writers_lose_and_duplicate_nothing(fresh_url):
    ctx = mp.get_context("fork")
    start, q = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(fresh_url, w, start, q)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    start.set()
    outcomes = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    errors = [e for _, _, e in outcomes if e]
    assert not errors, errors
    common = {ids[-1] for _, ids, _ in outcomes}
    assert len(common) == 1  # every writer got the same run id for the shared record
    with open_db(fresh_url) as db:
        c = counts(db)
        n_runs = WRITERS * RECORDS_PER_WRITER + 1
        assert c["runs"] == n_runs
        # fa2, naive, k_shared_new, and one k_<worker> per writer
        assert c["variants"] == 3 + WRITERS
        assert c["cases"] == 3
        assert c["results"] == WRITERS * RECORDS_PER_WRITER * 8 + 6
        with db.session() as s:
            per_run = s.execute(select(Result.run_id, func.count()).group_by(Result.run_id)
                                ).all()
            assert len(per_run) == n_runs
            assert len(set(s.execute(select(Run.uuid)).scalars())) == n_runs
            assert s.execute(select(func.count(func.distinct(Variant.name)))).scalar() == \
                3 + WRITERS
            assert s.execute(select(func.count(func.distinct(CaseRow.case_id)))).scalar() == 3
