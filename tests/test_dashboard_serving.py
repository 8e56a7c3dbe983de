"""The dashboard on serving case kinds: the committed H200 records (results/) plus serving
runs made through the harness's record path (tests/servingdata.py: the decode grid's paged
and varlen cases, the serving grid's varlen, paged and sliding-window cases). The case-kind
filter narrows every page that lists cases, the Roofline's decode section shows the
achieved GB/s the records imply, case ids of the new kinds are taken as they are, and a
database of dense cases only shows no filter at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import realdata
import servingdata
from sqlalchemy import create_engine

from harness.core.grids import get_grid
from harness.dashboard import case_kinds

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest
ROOT = Path(__file__).resolve().parents[1]
PAGES = ["overview", "history", "compare", "roofline", "correctness", "leaderboard", "run"]
FILTERED = ["history", "compare", "roofline", "correctness", "run"]
app = realdata.dashboard_app


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list]:
    return servingdata.shared(tmp_path_factory)


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> str:
    return realdata.shared("dense", tmp_path_factory)


sql = realdata.sql


def run_id(url: str, commit: str, grid: str) -> int:
    return sql(url, "SELECT id FROM runs WHERE \"commit\" = :c AND grids LIKE :g",
               c=commit, g=f"%{grid}%")[0][0]


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def frame(at: AppTest, column: str) -> pd.DataFrame:
    return next(d.value for d in at.dataframe if column in d.value.columns)


def chart_rows(at: AppTest, field: str) -> list[dict]:
    """The rows of every chart's datasets that carry `field` and a case id (the points,
    not the ceilings)."""
    import io

    import pyarrow as pa

    rows = []
    for chart in at.get("vega_lite_chart"):
        for ds in chart.proto.datasets:
            table = pa.ipc.open_stream(io.BytesIO(ds.data.data)).read_all().to_pylist()
            rows += [r for r in table if field in r and "case_id" in r]
    return rows


def filter_widgets(at: AppTest) -> list:
    return ([w for w in at.multiselect if w.label == "Case layout"]
            + [w for w in at.selectbox if w.label == "Sliding window"])


def label(case_id: str) -> str:
    """The layout the decode view should show, from the harness's own parse of the id."""
    from harness.core.cases import Case, Layout

    c = Case.from_id(case_id)
    name = {Layout.DENSE: "contiguous", Layout.VARLEN: "varlen"}.get(c.layout) or \
        f"paged {c.page_size}"
    return name + (", window" if c.has_window else "")


def kind(case_id: str) -> tuple[str, bool]:
    from harness.core.cases import Case

    c = Case.from_id(case_id)
    return c.layout.value, c.has_window


# --- the case kinds ------------------------------------------------------------------------


def test_decode_bound_is_the_planners() -> None:
    from harness.runs.plan_order import DECODE_MAX_SEQLEN_Q

    assert case_kinds.DECODE_MAX_SEQLEN_Q == DECODE_MAX_SEQLEN_Q


def test_case_kinds_match_the_case_ids(serving: tuple[str, list]) -> None:
    from harness.core.cases import Case
    from harness.core.grids import get_grid

    url, _ = serving
    engine = create_engine(url)
    try:
        kinds = case_kinds.case_kinds(engine)
    finally:
        engine.dispose()
    # The committed serving records predate the decode grid's e4m3 twins: every other case.
    wanted = {c.id for g in ("decode", "serving") for c in get_grid(g) if not c.fp8.is_kv_cache}
    assert wanted <= set(kinds["case_id"])
    for row in kinds.itertuples():
        c = Case.from_id(row.case_id)
        assert (row.layout, row.page_size, row.full_lengths, row.windowed, row.kv_heads,
                row.seqlen_q) == (c.layout.value, c.page_size, c.full_lengths, c.has_window,
                                  c.kv_heads, c.seqlen_q), row.case_id
        assert row.layout_label == label(row.case_id)
    assert case_kinds.present(kinds) == (["dense", "varlen", "paged"], ["with", "without"])


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_serving(page: str, serving: tuple[str, list], monkeypatch) -> None:
    at = app(serving[0], monkeypatch, page=page)
    assert "Reading the database" not in texts(at.error)
    widgets = filter_widgets(at)
    if page in FILTERED:
        assert [w.label for w in widgets] == ["Case layout", "Sliding window"]
        assert widgets[0].options == ["dense", "varlen", "paged"]
    else:
        assert widgets == []


@pytest.mark.parametrize("page", PAGES)
def test_dense_only_has_no_filter(page: str, dense: str, monkeypatch) -> None:
    at = app(dense, monkeypatch, page=page)
    assert filter_widgets(at) == []
    assert not at.warning


def test_dense_only_link_naming_a_kind(dense: str, monkeypatch) -> None:
    at = app(dense, monkeypatch, page="roofline", layout="paged")
    assert "holds only dense cases without a sliding window" in texts(at.warning)
    assert filter_widgets(at) == []


def test_database_before_migration_0004(tmp_path: Path, monkeypatch) -> None:
    """A database not yet upgraded to the serving columns: every case dense, no filter."""
    from harness.records.db.migrate import downgrade

    url = realdata.build("one_grid", tmp_path)
    engine = create_engine(url)
    try:
        downgrade(engine, "0003")
        assert "layout" not in {c[1] for c in sql(url, "PRAGMA table_info(cases)")}
        kinds = case_kinds.case_kinds(engine)
    finally:
        engine.dispose()
    assert set(kinds["layout"]) == {"dense"} and not kinds["windowed"].any()
    for page in ("roofline", "history", "compare", "run", "correctness"):
        at = app(url, monkeypatch, page=page)
        assert filter_widgets(at) == [] and not at.error, page


# --- the decode roofline -------------------------------------------------------------------


def expected_decode(record, source: str = "model") -> pd.DataFrame:
    rows = []
    for e in record.results:
        b = e["bytes"].get(source)
        if (e["status"] == "passed" and e["case"]["seqlen_q"] <= 16 and e.get("median_ms")
                and b):
            rows.append({"variant": e["kernel"], "case_id": e["case_id"],
                         "layout": label(e["case_id"]),
                         "gbps": b / (e["median_ms"] * 1e-3) / 1e9})
    return pd.DataFrame(rows)


def test_decode_bandwidth(serving: tuple[str, list], monkeypatch) -> None:
    url, records = serving
    decode = records[0]
    copy = decode.calibration["copy_gbps"]
    at = app(url, monkeypatch, page="roofline", run=str(run_id(url, servingdata.COMMIT_A,
                                                                 "decode")))
    assert "Decode: achieved bandwidth" in [s.value for s in at.subheader]
    assert "copy ceiling, 4,251 GB/s" in texts(at.caption)
    for source in ("ideal", "model"):  # ideal bytes are the default
        if source == "model":
            at.radio(key="decode_bytes").set_value("model").run()
        want = expected_decode(decode, source)
        assert {"contiguous", "paged 64", "paged 256", "varlen"} == set(want["layout"])
        # Every point: its record's bytes over its median time.
        points = {(r["variant"], r["case_id"]): r["gbps"] for r in chart_rows(at, "gbps")}
        assert len(points) == len(want)
        for r in want.itertuples():
            assert points[(r.variant, r.case_id)] == pytest.approx(r.gbps, rel=1e-9)
        table = frame(at, "best GB/s").set_index(["variant", "layout"])
        best = want.groupby(["variant", "layout"])["gbps"].agg(["max", "size"])
        assert sorted(table.index) == sorted(best.index)
        for key, row in best.iterrows():
            assert table.loc[key, "best GB/s"] == pytest.approx(row["max"], rel=1e-9)
            assert table.loc[key, "cases"] == row["size"]
            assert table.loc[key, "best of copy"] == pytest.approx(row["max"] / copy, rel=1e-9)
    # Paged against contiguous of one variant: the generated paged cost shows.
    at.radio(key="decode_bytes").set_value("ideal").run()
    ideal = frame(at, "best GB/s").set_index(["variant", "layout"])["best GB/s"]
    assert ideal[("splitkv", "contiguous")] > ideal[("splitkv", "paged 64")]
    assert ideal[("sdpa_cudnn", "paged 256")] > ideal[("sdpa_cudnn", "paged 64")]
    # fa2_mma declares no paged or varlen layout: only its contiguous cases are shown.
    assert [lay for v, lay in table.index if v == "fa2_mma"] == ["contiguous"]


def test_decode_section_of_the_committed_decode_run(dense: str, monkeypatch) -> None:
    decode = realdata.load(realdata.DECODE)
    rid = sql(dense, "SELECT id FROM runs WHERE uuid = :u", u=decode["uuid"])[0][0]
    at = app(dense, monkeypatch, page="roofline", run=str(rid))
    table = frame(at, "best GB/s")
    assert set(table["layout"]) == {"contiguous"}
    assert set(table["variant"]) == {"fa2_mma", "sdpa_cudnn", "sdpa_flash", "splitkv"}
    splitkv = max(e["bytes"]["ideal"] / (e["median_ms"] * 1e-3) / 1e9
                  for e in decode["results"] if e["kernel"] == "splitkv" and e["median_ms"])
    got = table.set_index("variant").loc["splitkv", "best GB/s"]
    assert got == pytest.approx(splitkv, rel=1e-9)


def test_decode_section_of_the_committed_serving_decode_run(tmp_path_factory, monkeypatch
                                                            ) -> None:
    """The real H200 decode record with paged and varlen caches: every layout shows, at
    the record's own ideal bytes over its medians, and paged against contiguous reads
    off the table."""
    url = realdata.shared("sample", tmp_path_factory)
    record = realdata.load(realdata.SERVING_DECODE)
    rid = sql(url, "SELECT id FROM runs WHERE uuid = :u", u=record["uuid"])[0][0]
    at = app(url, monkeypatch, page="roofline", run=str(rid))
    table = frame(at, "best GB/s").set_index(["variant", "layout"])
    assert set(table.loc["splitkv"].index) == {"contiguous", "paged 64", "paged 256", "varlen"}
    assert set(table.index.get_level_values(0)) == {"splitkv", "sdpa_cudnn", "sdpa_flash"}
    for (variant, layout), row in table.iterrows():
        rows = [e for e in record["results"] if e["kernel"] == variant and e["median_ms"]
                and label(e["case_id"]) == layout]
        want = max(e["bytes"]["ideal"] / (e["median_ms"] * 1e-3) / 1e9 for e in rows)
        assert row["best GB/s"] == pytest.approx(want, rel=1e-9)
        assert row["cases"] == len(rows)


def test_no_decode_section_without_decode_cases(dense: str, monkeypatch) -> None:
    rid = sql(dense, "SELECT id FROM runs WHERE uuid = :u",
              u=realdata.load(realdata.PERF)["uuid"])[0][0]
    at = app(dense, monkeypatch, page="roofline", run=str(rid))
    assert "Decode: achieved bandwidth" not in [s.value for s in at.subheader]


# --- the filter on each page ---------------------------------------------------------------


def test_roofline_filter(serving: tuple[str, list], monkeypatch) -> None:
    url, _ = serving
    rid = run_id(url, servingdata.COMMIT_A, "decode")
    at = app(url, monkeypatch, page="roofline", run=str(rid), layout="paged")
    cases = {r["case_id"] for r in chart_rows(at, "intensity")}
    assert cases and {kind(c)[0] for c in cases} == {"paged"}
    assert {lay.split()[0] for lay in frame(at, "best GB/s")["layout"]} == {"paged"}
    # Through the widget: the sliding-window cases of a serving run only.
    at = app(url, monkeypatch, page="roofline",
             run=str(run_id(url, servingdata.COMMIT_A, "serving")))
    next(w for w in at.selectbox if w.label == "Sliding window").set_value("with").run()
    assert at.query_params["window"] in ("with", ["with"])
    cases = {r["case_id"] for r in chart_rows(at, "intensity")}
    assert cases and all(kind(c)[1] for c in cases)


def test_compare_filter(serving: tuple[str, list], monkeypatch) -> None:
    url, records = serving
    a, b = (run_id(url, c, "serving") for c in (servingdata.COMMIT_A, servingdata.COMMIT_B))
    at = app(url, monkeypatch, page="compare", base=str(a), new=str(b), layout="paged")
    per_case = frame(at, "time ratio new/base")
    pairs = ({(e["kernel"], e["case_id"]) for e in records[1].results}
             & {(e["kernel"], e["case_id"]) for e in records[2].results})
    paged = {p for p in pairs if kind(p[1])[0] == "paged"}
    assert set(zip(per_case["variant"], per_case["case_id"], strict=True)) == paged
    median = {(r, e["kernel"], e["case_id"]): e["median_ms"]
              for r, rec in ((a, records[1]), (b, records[2])) for e in rec.results}
    for _, r in per_case.iterrows():
        new, old = (median[(run, r["variant"], r["case_id"])] for run in (b, a))
        if new is not None and old is not None:
            assert r["time ratio new/base"] == pytest.approx(new / old, rel=1e-9)
    flex = per_case[per_case["variant"] == "flex_attention"]
    assert flex["time ratio new/base"].median() == pytest.approx(servingdata.SLOWER_AT_B,
                                                                 rel=0.05)
    stored = dict(((v, c), verdict) for v, c, verdict in sql(
        url, "SELECT variant, case_id, verdict FROM comparisons WHERE run_id = :r "
             "AND base_run_id = :b", r=b, b=a))
    assert list(flex["verdict"]) == [stored.get(("flex_attention", c)) for c in flex["case_id"]]
    assert "regression" in set(flex["verdict"])
    summary = frame(at, "geomean ratio").set_index("variant")
    assert summary.loc["flex_attention", "pairs"] == len(flex)
    assert f"{len(paged)} of the {len(pairs)} shared pairs" in texts(at.caption)
    # Windowless dense cases: no flex_attention slowdown there.
    at = app(url, monkeypatch, page="compare", base=str(a), new=str(b), layout="dense",
             window="without")
    assert "share no" not in texts(at.warning)
    assert "No shared (variant, case) pair of the chosen case kinds." in texts(at.info)


def test_history_filter_and_serving_ids(serving: tuple[str, list], monkeypatch) -> None:
    url, _ = serving
    at = app(url, monkeypatch, page="history", layout="varlen")
    case_box = next(w for w in at.selectbox if w.label == "Case")
    assert case_box.options and all(kind(c)[0] == "varlen" for c in case_box.options)
    paged = "b1h32k8-1x65536-d128-fp16-none-paged64f"
    at = app(url, monkeypatch, page="history", variant="splitkv", case=paged,
             gpu="nvidia-h200")
    assert not [w for w in at.warning if "not in this database" in str(w.value)]
    assert next(w for w in at.selectbox if w.label == "Case").value == paged
    # The "All points" table (it has median_ms; the flagged-runs table above it, shown when
    # the generated run is flagged against a real one, has none).
    points = frame(at, "median_ms")
    # The points of the sample's H200 decode records and of the generated decode run.
    committed = [p for p in realdata.SAMPLE if p.name.startswith("h200-")
                 if paged in {e["case_id"] for e in realdata.load(p)["results"]}]
    assert committed and list(points["status"]) == ["passed"] * (len(committed) + 1)
    assert points["median_ms"].notna().all()
    window = next(c.id for c in get_grid("serving") if c.has_window and not c.is_serving)
    at = app(url, monkeypatch, page="history", variant="flex_attention", case=window,
             gpu="nvidia-h200")
    assert len(frame(at, "series")) == 2  # the serving runs at A and at B
    # A linked case outside the chosen kinds: a note, not "not in this database".
    at = app(url, monkeypatch, page="history", case=paged, layout="varlen")
    assert not [w for w in at.warning if "not in this database" in str(w.value)]
    assert f"Case `{paged}` is not of the chosen case kinds" in texts(at.caption)


def test_run_filter(serving: tuple[str, list], monkeypatch) -> None:
    url, records = serving
    b = run_id(url, servingdata.COMMIT_B, "serving")
    at = app(url, monkeypatch, page="run", run=str(b), layout="varlen")
    fails = frame(at, "message")
    assert list(fails["variant"]) == [servingdata.FAILS_AT_B]
    assert kind(fails.iloc[0]["case_id"])[0] == "varlen"
    varlen = [e for e in records[2].results if kind(e["case_id"])[0] == "varlen"]
    assert at.metric[0].value == str(len(varlen))
    at = app(url, monkeypatch, page="run", run=str(b), layout="paged")
    assert "No failed" in texts(at.success)
    assert at.metric[0].value == str(sum(kind(e["case_id"])[0] == "paged"
                                         for e in records[2].results))
    flagged = frame(at, "commits")
    assert set(flagged["variant"]) == {"flex_attention"}
    assert {kind(c)[0] for c in flagged["case_id"]} == {"paged"}


def test_correctness_filter(serving: tuple[str, list], monkeypatch) -> None:
    url, _ = serving
    b = run_id(url, servingdata.COMMIT_B, "serving")
    at = app(url, monkeypatch, page="correctness", run=str(b), layout="dense")
    cells = {r["case_id"] for r in chart_rows(at, "err_ratio")}
    assert cells and {kind(c)[0] for c in cells} == {"dense"}
    at = app(url, monkeypatch, page="correctness", run=str(b), layout="varlen,paged",
             window="without")
    cells = {r["case_id"] for r in chart_rows(at, "err_ratio")}
    assert cells and all(kind(c)[0] != "dense" and not kind(c)[1] for c in cells)
    assert frame(at, "message")["variant"].tolist() == [servingdata.FAILS_AT_B]


_BOUNDARY = """
import json, sys
from streamlit.testing.v1 import AppTest
for params in {views!r}:
    at = AppTest.from_file({app!r}, default_timeout=90)
    for k, v in params.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, (params, [e.value for e in at.exception])
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton", "cupy")
                        or m.startswith(("harness.core", "harness.candidates")))))
"""


def test_serving_pages_import_nothing_heavy(serving: tuple[str, list]) -> None:
    url, _ = serving
    views = [{"page": p, "layout": "paged,varlen"} for p in FILTERED] + [
        {"page": "roofline", "run": str(run_id(url, servingdata.COMMIT_A, "decode"))}]
    code = _BOUNDARY.format(views=views, app=str(ROOT / "harness" / "dashboard" / "app.py"))
    env = dict(os.environ, FA_HARNESS_DB=url, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
