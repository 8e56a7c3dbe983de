"""The case filter's extras (score modifiers, d_v, FP8 inputs, input distributions): the
dashboard's parse of a case id against the harness's own (harness.core.cases.Case), and
the filter on a database holding a real mods-grid run (the CPU FA2 model's record,
made by `fa-harness run --grid mods --record`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import realdata

from harness.core.cases import Case
from harness.core.distributions import Dist
from harness.core.grids import get_grid
from harness.dashboard import case_kinds

pytest.importorskip("streamlit.testing.v1")
ROOT = Path(__file__).resolve().parents[1]


def expected(c: Case) -> tuple[str, ...]:
    got = [name for name, on in (
        ("softcap", bool(c.softcap)), ("alibi", c.alibi), ("sinks", c.sinks),
        ("d_v", bool(c.head_dim_v)), ("fp8", c.fp8.quantizes_q),
        ("fp8 cache", c.fp8.is_kv_cache), ("outliers", c.dist is Dist.OUTLIERS),
        ("large", c.dist is Dist.LARGE)) if on]
    return tuple(got) or (case_kinds.PLAIN,)


@pytest.mark.parametrize("grid", ["mods", "smoke", "full", "decode", "serving", "perf"])
def test_the_extras_of_a_case_id_are_the_harness_own(grid):
    for c in get_grid(grid):
        assert case_kinds.extras_of(c.id) == expected(c), c.id
    if grid == "mods":  # every extra is in the mods grid
        held = {e for c in get_grid(grid) for e in case_kinds.extras_of(c.id)}
        assert held == {case_kinds.PLAIN, *(n for n, _ in case_kinds.EXTRAS)}


@pytest.fixture(scope="module")
def mods_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    d = tmp_path_factory.mktemp("mods")
    rec = d / "mods-record.json"
    subprocess.run([sys.executable, "-m", "harness", "run", "--grid", "mods", "--kernels",
                    "fa2_model", "--device", "cpu", "--no-progress", "--no-store",
                    "--record", str(rec)], check=True, cwd=ROOT, capture_output=True,
                   timeout=300)
    url = realdata.fa_import(f"sqlite:///{d}/m.sqlite", rec)
    status = {r[0]: r[1] for r in realdata.sql(
        url, "SELECT c.case_id, r.status FROM results r JOIN cases c ON c.id = r.case_pk")}
    return url, status


def test_the_filter_offers_the_extras_a_database_holds(mods_db, monkeypatch):
    url, _ = mods_db
    at = realdata.dashboard_app(url, monkeypatch, page="correctness")
    [extras] = [w for w in at.multiselect if w.label == "Case extras"]
    assert extras.options == ["plain", "softcap", "alibi", "sinks", "d_v", "fp8",
                              "fp8 cache", "outliers", "large"]
    assert extras.value == extras.options  # every kind until one is chosen


def test_a_link_naming_extras_keeps_only_those_cases(mods_db, monkeypatch):
    url, status = mods_db
    at = realdata.dashboard_app(url, monkeypatch, page="correctness", extras="softcap")
    [extras] = [w for w in at.multiselect if w.label == "Case extras"]
    assert extras.value == ["softcap"]
    passed = {m.label: m.value for m in at.metric}["passed"]
    want = sum(1 for cid, s in status.items()
               if "softcap" in case_kinds.extras_of(cid) and s == "passed")
    assert 0 < want < sum(1 for s in status.values() if s == "passed")
    assert int(str(passed).replace(",", "")) == want
    bad = realdata.dashboard_app(url, monkeypatch, page="correctness", extras="nothing")
    assert "`extras=nothing` from the link" in " ".join(w.value for w in bad.warning)
