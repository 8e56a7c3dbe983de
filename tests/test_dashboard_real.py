"""The dashboard on the project's own H200 records (results/, imported with `fa-harness
import`) and on variations derived from them (tests/realdata.py): every page and every
README deep link renders with no exception, and shows what the records hold."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest
import realdata

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["overview", "history", "compare", "roofline", "correctness", "leaderboard", "run",
         "submit"]
KINDS = ["sample", "history", "one_grid", "submissions"]

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # Built once per session, and the sample of the committed records shared with the
    # other modules that read it.
    return {k: realdata.shared(k, tmp_path_factory) for k in KINDS}


app = realdata.dashboard_app


sql = realdata.sql


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def charts(at: AppTest) -> list:
    return at.get("vega_lite_chart")


def spec(chart) -> dict:
    import json

    return json.loads(chart.proto.spec)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders(kind: str, page: str, dbs: dict[str, str], monkeypatch) -> None:
    at = app(dbs[kind], monkeypatch, page=page)
    assert "None" not in [str(m.value) for m in at.markdown]  # no stray magic output
    if kind != "submissions" and page in ("history", "roofline", "correctness"):
        assert charts(at), f"{page} drew no chart on {kind}"


def ds_rows(ds) -> list[dict]:
    import io

    import pyarrow as pa

    return pa.ipc.open_stream(io.BytesIO(ds.data.data)).read_all().to_pylist()


def readme_links() -> list[str]:
    """The deep links the documentation gives (the README's overview and the dashboard's
    page, docs/dashboard.md)."""
    text = "".join((ROOT / name).read_text() for name in ("README.md", "docs/dashboard.md"))
    return sorted(set(re.findall(r"`(\?page=[^`]+)`", text)))


def test_readme_has_deep_links() -> None:
    assert len(readme_links()) >= 3


@pytest.mark.parametrize("link", readme_links())
def test_readme_deep_links(link: str, dbs: dict[str, str], monkeypatch) -> None:
    url = dbs["history"]
    run_id = sql(url, "SELECT MAX(id) FROM runs")[0][0]
    case_id = sql(url, "SELECT case_id FROM cases ORDER BY case_id LIMIT 1")[0][0]
    filled = (link.replace("<case id>", case_id).replace("run=42", f"run={run_id}")
              .replace("<run or commit>", str(run_id)).replace("gpu=...", "gpu=nvidia-h200"))
    params = dict(parse_qsl(urlsplit(filled).query))
    at = app(url, monkeypatch, **params)
    assert not at.error, texts(at.error)
    assert not [w for w in at.warning if "not in this database" in str(w.value)]


def test_pandas_row_dtype(dbs: dict[str, str], monkeypatch) -> None:
    """The newest decode run has only fp16 cases: Compare, Roofline and Correctness must
    read its variant names as text (pandas once took the row's `dtype` column as the
    frame's dtype)."""
    url = dbs["history"]
    run_id = sql(url, "SELECT r.run_id FROM results r JOIN cases c ON c.id = r.case_pk "
                      "GROUP BY r.run_id HAVING COUNT(DISTINCT c.dtype) = 1")[0][0]
    for page in ("compare", "roofline", "correctness"):
        at = app(url, monkeypatch, page=page, run=str(run_id), new=str(run_id))
        assert charts(at) or page == "compare"


def test_roofline_real_calibration(dbs: dict[str, str], monkeypatch) -> None:
    url = dbs["sample"]
    run_id = sql(url, "SELECT id FROM runs WHERE grids LIKE '%perf%' "
                      "AND gpu_model_key = 'nvidia-h200' ORDER BY created_at")[0][0]
    at = app(url, monkeypatch, page="roofline", run=str(run_id))
    caption = texts(at.caption)
    assert "copy 4,251 GB/s" in caption, caption
    assert "float16 713 TFLOP/s" in caption and "bfloat16 747 TFLOP/s" in caption
    chart = charts(at)[0]
    roofs = {d.get("roof") for ds in chart.proto.datasets for d in
             ds_rows(ds) if d.get("roof")}
    assert any("713" in r for r in roofs) and any("747" in r for r in roofs), roofs
    summary = at.dataframe[-1].value
    # sdpa_cudnn's best (~648 TFLOP/s) against its own dtype's roof: near 0.9, not 0.114.
    assert 0.8 < summary.loc["sdpa_cudnn", "best_of_roof"] <= 1.0
    assert (summary["best_of_roof"] <= 1.0).all()


def test_overview_per_grid(dbs: dict[str, str], monkeypatch) -> None:
    at = app(dbs["sample"], monkeypatch)
    latest = at.dataframe[0].value
    # One row per GPU model and grid of the records (all on one branch): the H200's grids
    # and the H100's.
    recs = [json.loads(f.read_text()) for f in realdata.SAMPLE]
    rows = {(r["gpu"]["model_key"], "+".join(r["grids"])) for r in recs}
    assert sorted(zip(latest["gpu_model_key"], latest["grid"], strict=True)) == sorted(rows)
    assert ("nvidia-h100-80gb-hbm3", "perf") in rows


def test_import_computes_verdicts(dbs: dict[str, str]) -> None:
    url = dbs["history"]
    child = sql(url, "SELECT id FROM runs WHERE \"commit\" = :c AND grids LIKE '%perf%' "
                     "AND branch = 'main'", c=realdata.CHILD)[0][0]
    rows = sql(url, "SELECT variant, verdict FROM comparisons WHERE run_id = :r", r=child)
    slowed = {v for k, v in rows if k == realdata.SLOWED}
    assert slowed == {"regression"}, slowed
    assert ("fa2_mma", "correctness_regression") in rows
    assert {v for k, v in rows if k == "sdpa_cudnn"} <= {"same", "inconclusive"}


def _select(at: AppTest, key: str, row: int, column: str) -> None:
    """Select one cell of table `key` (what a click on it does) and run the app again."""
    at.session_state[key] = {"selection": {"cells": [(row, column)]}}
    at.run()
    assert not at.exception, [e.value for e in at.exception]


def test_regression_is_followable(dbs: dict[str, str], monkeypatch) -> None:
    url = dbs["history"]
    child = sql(url, "SELECT id FROM runs WHERE \"commit\" = :c AND grids LIKE '%perf%' "
                     "AND branch = 'main'", c=realdata.CHILD)[0][0]
    first = sql(url, "SELECT \"commit\" FROM runs WHERE id = 2")[0][0]
    for params in ({"page": "run", "run": str(child)}, {}):
        at = app(url, monkeypatch, **params)
        found = next(d for d in at.dataframe if "commits" in d.value.columns)
        table, key = found.value, found.key
        pos = list(table["variant"]).index(realdata.SLOWED)
        row = table.iloc[pos]
        assert row["commits"] == f"{first[:10]}..{realdata.CHILD[:10]}"
        assert row["new commit"] == f"{realdata.REPO_URL}/commit/{realdata.CHILD}"
        assert row["base commit"] == f"{realdata.REPO_URL}/commit/{first}"
        assert row["compare"] == f"2 vs {child}"
        # Its History and its Compare open in this tab (the cell selected, as a click).
        for column, title, want in (
                ("history", "History", {"variant": "fa2_simt", "gpu": "nvidia-h200",
                                        "case": row["case_id"]}),
                ("compare", "Compare", {"base": "2", "new": str(child)})):
            at = app(url, monkeypatch, **params)
            _select(at, key, pos, column)
            assert at.title[0].value == title
            got = {k: at.query_params[k] for k in want}
            assert {k: v[0] if isinstance(v, list) else v for k, v in got.items()} == want


def _case(url: str, variant: str, grid: str, dtype: str) -> str:
    return sql(url, "SELECT c.case_id FROM results r JOIN cases c ON c.id = r.case_pk "
                    "JOIN variants v ON v.id = r.variant_id JOIN runs ON runs.id = r.run_id "
                    "WHERE v.name = :v AND runs.grids LIKE :g AND c.dtype = :d "
                    "ORDER BY c.case_id LIMIT 1", v=variant, g=f"%{grid}%", d=dtype)[0][0]


def test_history_flags_and_variants(dbs: dict[str, str], monkeypatch) -> None:
    url = dbs["history"]
    case_id = _case(url, "fa2_simt", "perf", "bfloat16")
    at = app(url, monkeypatch, page="history", variant="fa2_simt,sdpa_cudnn", case=case_id,
             gpu="NVIDIA H200", branch="main")
    assert at.query_params["gpu"] in (["nvidia-h200"], "nvidia-h200")
    points = at.dataframe[-1].value
    assert set(points["series"]) == {"fa2_simt | nvidia-h200", "sdpa_cudnn | nvidia-h200"}
    flagged = at.dataframe[0].value
    assert set(flagged["verdict"]) == {"regression"}
    assert set(flagged["series"]) == {"fa2_simt | nvidia-h200"}
    base, new = flagged.iloc[0]["compare"].split(" vs ")
    assert sql(url, "SELECT \"commit\" FROM runs WHERE id = :n", n=int(new))[0][0] == \
        realdata.CHILD
    _select(at, "history_flagged", 0, "compare")
    assert at.title[0].value == "Compare"
    assert [str(at.query_params[k]).strip("[]'") for k in ("base", "new")] == [base, new]
    assert all(w.endswith("UTC") for w in points["when"])


def test_history_commit_order(dbs: dict[str, str], monkeypatch) -> None:
    url = dbs["history"]
    case_id = _case(url, "splitkv", "decode", "float16")
    at = app(url, monkeypatch, page="history", variant="splitkv", case=case_id,
             gpu="nvidia-h200", branch="main")
    points = at.dataframe[-1].value
    first = sql(url, "SELECT \"commit\" FROM runs WHERE id = 2")[0][0]
    # Three runs: the first commit, the child, and a re-run of the first commit made last;
    # in commit order the re-run sits with the first commit, before the child.
    assert [lab[-7:] for lab in points["label"]] == [first[:7], first[:7],
                                                    realdata.CHILD[:7]]
    assert list(points["when"]) != sorted(points["when"])
    assert set(points["series"]) == {"splitkv | nvidia-h200"}
    assert set(points["grid"]) == {"decode"}
    # The chart's ticks in the same order: every layer sorts its commits by position.
    chart = charts(at)[0]
    assert {json.dumps(layer["encoding"]["x"]["sort"]) for layer in spec(chart)["layer"]} == {
        json.dumps({"field": "seq", "op": "min"})}
    rows = [r for ds in chart.proto.datasets for r in ds_rows(ds)]
    ticks = [label for _, label in sorted({(r["seq"], r["label"]) for r in rows})]
    assert ticks == list(dict.fromkeys(points["label"]))


def test_correctness_follows_linked_run(dbs: dict[str, str], monkeypatch) -> None:
    url = dbs["history"]
    other = sql(url, "SELECT id FROM runs WHERE gpu_model_key = 'nvidia-h100-80gb-hbm3'")[0][0]
    at = app(url, monkeypatch, page="correctness", run=str(other), gpu="nvidia-h200")
    assert [s.value for s in at.selectbox][:2] == ["nvidia-h100-80gb-hbm3", other]
    assert "nvidia-h100" in str(spec(charts(at)[-1]).get("title"))


def test_heatmap_one_row_per_variant(dbs: dict[str, str], monkeypatch) -> None:
    at = app(dbs["history"], monkeypatch, page="correctness", run="3")
    heat = spec(charts(at)[0])
    assert heat["encoding"]["y"]["field"] == "variant"
    assert heat["encoding"]["x"]["field"] == "case_id"
    assert heat["height"] == {"step": 30}
    failed = at.dataframe[0].value
    assert list(failed["status"]) == ["failed"]


def test_compare_across_gpus_and_no_shared_case(dbs: dict[str, str], monkeypatch) -> None:
    url = dbs["history"]
    h100 = sql(url, "SELECT id FROM runs WHERE gpu_model_key = 'nvidia-h100-80gb-hbm3'")[0][0]
    at = app(url, monkeypatch, page="compare", base="2", new=str(h100))
    table = at.dataframe[1].value
    assert list(table.columns[:2]) == ["verdict", "time ratio new/base"]
    assert table["verdict"].isna().all()
    assert "two GPU models" in texts(at.info)
    flash = table[table["variant"] == "sdpa_flash"]["time ratio new/base"]
    assert flash.min() == pytest.approx(1.7, rel=1e-6)
    decode = sql(url, "SELECT id FROM runs WHERE grids LIKE '%decode%' LIMIT 1")[0][0]
    at = app(url, monkeypatch, page="compare", base="2", new=str(decode))
    assert "share no (variant, case)" in texts(at.warning)


def test_compare_opens_on_the_base_run_that_shares_the_runs_cases(dbs: dict[str, str],
                                                                   monkeypatch) -> None:
    """The committed perf-bwd records come one per dtype. The newest bf16 run was judged
    against a pooled window holding the fp16 run of the commit before, whose cases it
    lacks (`missing` verdicts name that run): Compare opens on the bf16 base run, and
    the Run page names it as the baseline."""
    from sqlalchemy import create_engine

    from harness.dashboard.compare_data import default_base

    url = dbs["sample"]
    new = sql(url, "SELECT id FROM runs WHERE grids LIKE '%perf-bwd%' "
                   "ORDER BY created_at DESC LIMIT 1")[0][0]
    missing = sql(url, "SELECT DISTINCT base_run_id FROM comparisons WHERE run_id = :r "
                       "AND verdict = 'missing'", r=new)
    assert missing  # the situation this test is about is in the committed records
    base = default_base(create_engine(url), new)
    assert base not in [m for (m,) in missing] or sql(
        url, "SELECT count(*) FROM comparisons WHERE run_id = :r AND base_run_id = :b "
             "AND verdict != 'missing'", r=new, b=base)[0][0]
    at = app(url, monkeypatch, page="compare", new=str(new))
    assert "share no" not in texts(at.warning)
    assert next(s.value for s in at.selectbox if s.label == "Base run") == base
    # The Run page names the same baseline and links the same Compare.
    at = app(url, monkeypatch, page="run", run=str(new))
    assert f"Baseline: run #{base}" in [link.proto.label for link in at.get("page_link")]


def test_pickers_open_on_the_gpu_with_the_most_runs(dbs: dict[str, str], monkeypatch) -> None:
    """The committed records hold a few H100 runs beside the H200 history. By name the
    H100 sorts first; opened with no link, Compare must open on the H200 (the model with
    the most runs) with two runs to compare, its newest and its baseline; the H100's
    runs compare among themselves; a GPU with one run says there is nothing yet."""
    url = dbs["sample"]
    gpus = dict(sql(url, "SELECT gpu_model_key, count(*) FROM runs GROUP BY gpu_model_key"))
    assert 1 < gpus["nvidia-h100-80gb-hbm3"] < gpus["nvidia-h200"]
    at = app(url, monkeypatch, page="compare")
    assert not at.warning
    gpu = next(s for s in at.selectbox if s.label == "New run's GPU")
    assert gpu.value == "nvidia-h200" and gpu.options[0] == "NVIDIA H200"
    base = next(s.value for s in at.selectbox if s.label == "Base run")
    new = next(s.value for s in at.selectbox if s.label == "New run")
    assert base != new
    at = app(url, monkeypatch, page="compare", gpu="nvidia-h100-80gb-hbm3")
    assert not at.warning and "only run on this GPU" not in texts(at.info)
    base = next(s.value for s in at.selectbox if s.label == "Base run")
    new = next(s.value for s in at.selectbox if s.label == "New run")
    assert base != new
    one = dbs["one_grid"]
    assert sql(one, "SELECT count(*) FROM runs") == [(1,)]
    at = app(one, monkeypatch, page="compare")
    assert not at.warning
    assert "only run on this GPU" in texts(at.info)


def test_leaderboard_explains_coverage(dbs: dict[str, str], monkeypatch) -> None:
    at = app(dbs["submissions"], monkeypatch, page="leaderboard")
    assert "coverage ranks before score" in texts(at.markdown)
    ranked = at.dataframe[0].value
    assert list(ranked["name"]) == ["full_grid", "easy_cases_only"]
    assert "gpu" in ranked.columns
    table = at.table[0].value
    assert table.iloc[0]["message"].endswith("where the causal mask is partial")


def test_submit_page_limits(dbs: dict[str, str], monkeypatch) -> None:
    at = app(dbs["submissions"], monkeypatch, page="submit")
    assert "1 MiB each, 2 MiB in all" in texts(at.caption)
    assert "None" not in [str(m.value) for m in at.markdown]


def test_sigterm_stops_the_server(dbs: dict[str, str], tmp_path: Path) -> None:
    """SIGTERM to `fa-harness dashboard` (what a service manager or CI step sends) stops
    the Streamlit server itself: nothing is left answering on the port."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from dashboard_server import free_port

    exe = shutil.which("fa-harness", path=str(Path(sys.executable).parent)) or shutil.which(
        "fa-harness")
    assert exe, "the fa-harness command is not installed"
    port = free_port()
    log = (tmp_path / "dash.log").open("wb")
    proc = subprocess.Popen([exe, "dashboard", "--db", dbs["sample"], "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    health = f"http://127.0.0.1:{port}/_stcore/health"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(health, timeout=1) as r:  # noqa: S310 - localhost
                return r.read().strip() == b"ok"
        except OSError:
            return False

    try:
        deadline = time.monotonic() + 90
        while not answers():
            assert proc.poll() is None, (tmp_path / "dash.log").read_text()
            assert time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.3)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        assert not answers(), "the server still answers after SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
