"""The dashboard in a real browser, on the project's own H200 records: `fa-harness
dashboard`'s command line on localhost, Playwright driving Debian's headless Chromium
(no browser download), every page opened and screenshotted; a page fails on a Python
traceback, on a chart that was not drawn, or on a chart drawn empty."""

from __future__ import annotations

import io
import os
import shutil
import time
from pathlib import Path

import dashboard_server
import pytest
import realdata

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(dashboard_server.find_chromium() is None,
                       reason="no Chromium (apt-get install chromium, or "
                              "python -m playwright install chromium)"),
]
sync_api = pytest.importorskip("playwright.sync_api")

# Kept for a person to look at; one folder per xdist worker, since each worker starts the
# module's server (and clears its folder) on its own while the other may be writing.
SHOTS = Path("/tmp/fa-harness-browser") / os.environ.get("PYTEST_XDIST_WORKER", "main")

# page key, its title, the charts it must draw, query parameters
PAGES = [
    ("overview", "Overview", 0, ""),
    ("history", "History", 1, "variant=fa2_simt,sdpa_cudnn&gpu=NVIDIA%20H200&branch=main"),
    ("compare", "Compare", 0, "base=2&new=3"),
    ("compare-gpus", "Compare", 0, "base=2&new=7"),
    ("roofline", "Roofline", 1, "run=2"),
    ("correctness", "Correctness", 2, "run=3"),
    ("leaderboard", "Leaderboard", 0, ""),
    ("run", "Run", 0, "run=3"),
    ("submit", "Submit a kernel", 0, ""),
]

_STATE = """() => {
  const h1 = document.querySelector('h1');
  return {title: h1 ? h1.innerText.trim() : null,
          running: !!document.querySelector('[data-testid="stStatusWidget"]'),
          exceptions: document.querySelectorAll('[data-testid="stException"]').length,
          // A data grid is a canvas drawn after the data arrives; until then a narrow or
          // flat placeholder.
          // Tables in a collapsed expander have no box and are not counted.
          tables_pending: [...document.querySelectorAll('[data-testid="stDataFrame"]')]
            .filter(e => { const r = e.getBoundingClientRect();
                           return e.offsetParent !== null && (r.width < 100 || r.height < 60);
                         }).length,
          charts: [...document.querySelectorAll('.vega-embed canvas, .vega-embed svg')]
            .filter(e => e.getBoundingClientRect().width > 50
                         && e.getBoundingClientRect().height > 50).length};
}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    shutil.rmtree(SHOTS, ignore_errors=True)  # no old screenshot mistaken for a new one
    url = realdata.build("history", tmp_path_factory.mktemp("browser"))
    realdata.with_submissions(url)
    with dashboard_server.serve(url, timeout_s=120) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = dashboard_server.launch(p)
        yield b
        b.close()


def _drawn(png: bytes) -> tuple[float, int]:
    """(largest channel variance, pixels that are neither white nor near-white)."""
    from PIL import Image, ImageStat

    img = Image.open(io.BytesIO(png)).convert("RGB")
    ink = sum(1 for px in img.get_flattened_data() if min(px) < 200)
    return max(ImageStat.Stat(img).var), ink


def _settle(page, title: str, want: int, timeout_s: float = 90.0) -> dict:
    """Poll until the page is done: a traceback shown, or the title, the charts and every
    visible table drawn with Streamlit idle for 2 s in a row (the running indicator shows
    only after a moment, so one idle look is not enough)."""
    deadline = time.monotonic() + timeout_s
    calm = 0
    state: dict = {}
    while time.monotonic() < deadline:
        state = page.evaluate(_STATE)
        if state["exceptions"]:
            return state
        done = (state["title"] == title and not state["running"]
                and state["charts"] >= want and state["tables_pending"] == 0)
        calm = calm + 1 if done else 0
        if calm >= 8:
            return state
        time.sleep(0.25)
    return state


@pytest.mark.parametrize(("name", "title", "want", "query"), PAGES,
                         ids=[p[0] for p in PAGES])
def test_page_in_chromium(name: str, title: str, want: int, query: str, server,
                          browser) -> None:
    page_key = name.split("-")[0]
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    try:
        page.goto(f"{server.base}/?page={page_key}" + (f"&{query}" if query else ""))
        state = _settle(page, title, want)
        SHOTS.mkdir(parents=True, exist_ok=True)
        shot = SHOTS / f"{name}.png"
        page.screenshot(path=str(shot), full_page=True)
        assert state["exceptions"] == 0, f"traceback on {name}: {state}"
        assert state["title"] == title and state["charts"] >= want, state
        assert state["tables_pending"] == 0, f"a table on {name} was not drawn: {state}"
        var, _ = _drawn(shot.read_bytes())
        assert var > 50, f"{name} looks blank (variance {var:.0f})"
        for i, chart in enumerate(page.locator(".vega-embed").all()):
            png = chart.screenshot()
            var, ink = _drawn(png)
            # An axis frame alone is a few hundred dark pixels; marks add thousands.
            assert ink > 1500 and var > 100, f"{name} chart {i} is empty ({ink} px, {var:.0f})"
            (SHOTS / f"{name}-chart{i}.png").write_bytes(png)
    finally:
        page.close()
