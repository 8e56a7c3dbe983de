"""The triage walk in a real browser (`fa-harness dashboard` on localhost, Playwright
driving Debian's headless Chromium), on the regression walk (tests/walkdata.py): the
Overview lists the fa2_mma step once for both GPU models with its bisect command; the
triage form acknowledges it behind a token; the list then shows who acknowledged it;
Compare opens on the alert. Each step is screenshotted."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import dashboard_server
import pytest
import walkdata

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(dashboard_server.find_chromium() is None,
                       reason="no Chromium (apt-get install chromium, or "
                              "python -m playwright install chromium)"),
]
sync_api = pytest.importorskip("playwright.sync_api")

SHOTS = Path("/tmp/fa-harness-browser") / os.environ.get("PYTEST_XDIST_WORKER", "main") / "triage"


@pytest.fixture(scope="module")
def walk(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    from harness.records.db.engine import make_engine
    from harness.submissions.tokens import create_token

    shutil.rmtree(SHOTS, ignore_errors=True)
    url = walkdata.build(tmp_path_factory.mktemp("browser-triage"),
                         walkdata.cache_dir(request.config, tmp_path_factory))
    engine = make_engine(url)
    try:
        _, token = create_token(engine, "ana")
    finally:
        engine.dispose()
    with dashboard_server.serve(url, timeout_s=120) as srv:
        yield srv, token


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = dashboard_server.launch(p)
        yield b
        b.close()


def _idle(page, title: str, timeout_s: float = 90.0) -> None:
    """Until the title shows and Streamlit has been idle for 2 s in a row."""
    deadline, calm = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline and calm < 8:
        state = page.evaluate("""() => ({
            title: (document.querySelector('h1') || {}).innerText,
            running: !!document.querySelector('[data-testid="stStatusWidget"]'),
            exceptions: document.querySelectorAll('[data-testid="stException"]').length})""")
        assert state["exceptions"] == 0, state
        calm = calm + 1 if (state["title"] or "").strip() == title and not state["running"] \
            else 0
        time.sleep(0.25)
    assert calm >= 8, f"{title} did not settle"


def _shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=False)


def test_triage_in_chromium(walk, browser) -> None:
    srv, token = walk
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    try:
        page.goto(f"{srv.base}/?page=overview&alert_state=all")
        _idle(page, "Overview")
        body = page.inner_text("body")
        assert "fa2_mma" in body and "nvidia-h100-80gb-hbm3, nvidia-h200" in body \
            or "nvidia-h200, nvidia-h100-80gb-hbm3" in body
        assert "fa-harness bisect --alert" in body and "withdrawn" in body
        _shot(page, "1-alerts")
        page.get_by_text("Triage: acknowledge, accept as expected, reopen").click()
        page.get_by_role("textbox", name="Token").fill(token)
        page.get_by_text("Apply", exact=True).click()
        _idle(page, "Overview")
        # 90 s, as _idle: on a 2-core CI machine under two test workers a rerun took over 30 s.
        page.wait_for_selector("text=acknowledged by ana", timeout=90_000)
        _shot(page, "2-acknowledged")
        assert "acknowledged" in page.inner_text("body")
        # The row's Compare link (the sidebar's comes first in the page).
        page.locator('[data-testid="stMain"]').get_by_role("link", name="Compare").first.click()
        _idle(page, "Compare")
        page.wait_for_selector("text=fa-harness bisect --alert", timeout=90_000)
        body = page.inner_text("body")
        assert "Alert #" in body and "fa2_mma on nvidia-h200" in body \
            or "fa2_mma on nvidia-h100" in body
        _shot(page, "3-compare")
        # The sidebar's Compare, bare: it opens on the team's newest live alert.
        page.locator('[data-testid="stSidebar"]').get_by_role("link", name="Compare").click()
        _idle(page, "Compare")
        page.wait_for_selector("text=fa-harness bisect --alert", timeout=90_000)
        assert "fa2_mma on nvidia" in page.inner_text("body")
    finally:
        page.close()
