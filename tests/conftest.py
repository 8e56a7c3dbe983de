"""Shared fixtures of the project's own tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from fake_candidates import make_fake

PG_ENV = "FA_HARNESS_TEST_PG"
# The server .ci/run starts (trust auth, database `test`). When FA_HARNESS_TEST_PG is not
# set and this one answers, the PostgreSQL tests use it, so `make test` on a developer's
# machine runs what CI runs; FA_HARNESS_TEST_PG= (empty) turns them off.
LOCAL_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _local_pg_answers() -> bool:
    try:
        import psycopg

        psycopg.connect(LOCAL_PG.replace("+psycopg", ""), connect_timeout=2).close()
    except Exception:  # noqa: BLE001 - no driver, no server, no database: no PG tests
        return False
    return True


def pytest_configure(config: pytest.Config) -> None:
    from harness.candidates.discovery import unregistered_note

    # Without the package's metadata the shipped Python candidates and this suite's
    # pytest plugin (both entry points) are missing, and dozens of tests would fail one
    # by one with a StopIteration or KeyError instead of this one line.
    note = unregistered_note()
    if note is not None:
        raise pytest.UsageError(f"the tests need fa-harness installed: {note}")
    if PG_ENV not in os.environ and _local_pg_answers():
        os.environ[PG_ENV] = LOCAL_PG


@pytest.fixture(autouse=True)
def scratch_home(tmp_path_factory, monkeypatch) -> None:
    """Every test records into its own scratch home: `fa-harness run` stores each run in
    the default database, which must never be a developer's own."""
    monkeypatch.setenv("FA_HARNESS_HOME", str(tmp_path_factory.mktemp("home")))
    monkeypatch.delenv("FA_HARNESS_DB", raising=False)
    monkeypatch.delenv("FA_HARNESS_SPOOL", raising=False)


@pytest.fixture(autouse=True)
def _discovery_restored(monkeypatch) -> None:
    """`discovery.configure` exports its folders to child processes through the
    environment (os.environ, not monkeypatch): without this, a test's folders (a variant
    defined twice, on purpose) leak into every later test of the same worker."""
    from harness.candidates import discovery

    for name in (discovery.ENV_CONFIG, discovery.ENV_KERNELS):
        monkeypatch.setenv(name, "")  # records the state before, restored after the test
        monkeypatch.delenv(name)
    monkeypatch.setattr(discovery, "_config", discovery.Config())


@pytest.fixture(autouse=True)
def _private_gpu_locks(tmp_path_factory, monkeypatch) -> None:
    """Each test its own GPU lock directory: tests of several checkouts share this host,
    and a worker test would otherwise find another test's worker on "its" GPU."""
    monkeypatch.setenv("FA_HARNESS_LOCK_DIR", str(tmp_path_factory.mktemp("gpu-locks")))


@pytest.fixture
def fake():
    """make_fake(bug="none", **fields) -> FakeCandidate (see tests/fake_candidates.py)."""
    return make_fake


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch on one intra-op thread: the CPU algorithm models run many small tile ops, where
    extra threads only add contention on a busy 2-core runner (measured there: 30x slower
    with 2 threads while other processes run)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty schema on the PostgreSQL server named by FA_HARNESS_TEST_PG, as that
    URL with a search_path selecting the schema; dropped afterwards. Skips without it."""
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} is not set (PostgreSQL URL of a scratch database)")
    from sqlalchemy import text

    from harness.records.db.engine import make_engine

    schema = f"fa_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = make_engine(base)
    try:
        with admin.begin() as c:
            c.execute(text(f"CREATE SCHEMA {schema}"))
        sep = "&" if "?" in base else "?"
        try:
            yield f"{base}{sep}options=-csearch_path%3D{schema}"
        finally:
            with admin.begin() as c:
                c.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    finally:
        admin.dispose()


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """A database holding the project's A/A gate runs 1-8 of fa2_mma on one H100
    (results/h100-20261207-aa), a commit chain judged as `import` does."""
    from pathlib import Path

    from harness.records.baseline import judge_runs
    from harness.records.db.store import open_db, store_record
    from harness.records.record import RunRecord

    aa = Path(__file__).resolve().parents[1] / "results" / "h100-20261207-aa"
    url = f"sqlite:///{tmp_path_factory.mktemp('aa-history')}/h.sqlite"
    with open_db(url) as db:
        for i in range(1, 9):
            judge_runs(db, [store_record(db, RunRecord.read(aa / f"aa-{i}-record.json"))])
    return url
