"""The dashboard in a real browser: `streamlit run` on localhost, headless Chromium opens a
History deep link, and the screenshot must show the drawn chart."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from harness.dashboard import headless
from harness.dashboard.synth import SynthSpec, generate, synth_cases

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(headless.find_chromium() is None,
                       reason="headless Chromium is not installed (apt-get install chromium)"),
]

SERIES_BLUE = (0x4C, 0x78, 0xA8)  # the history line and points (charts.history_chart)


def _near(px: tuple[int, ...], rgb: tuple[int, int, int], tol: int = 12) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(px[:3], rgb, strict=True))


def test_history_page_draws_chart(tmp_path: Path) -> None:
    from PIL import Image, ImageStat

    spec = SynthSpec(commits=16, gpus=2, variants=3, cases=4)
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    engine = create_engine(url)
    generate(engine, spec)
    engine.dispose()
    case_id = next(c.case_id for c in synth_cases(spec.cases) if "-bf16-" in c.case_id)

    with headless.serve(url) as server, headless.chromium() as cdp:
        link = (f"{server.base}/?page=history&variant=fa2_tc&case={case_id}"
                f"&gpu=NVIDIA%20H200")
        cap = headless.capture(cdp, link, want_charts=1, title="History", timeout_s=90)
    (tmp_path / "history.png").write_bytes(cap.png)
    shot = Path("/tmp/fa-harness-browser-history.png")
    shot.write_bytes(cap.png)  # kept for a person to look at

    assert cap.state.get("exceptions") == 0, cap.state
    assert cap.state.get("title") == "History", cap.state
    assert cap.state.get("charts", 0) >= 1, f"no chart drawn: {cap.state}"
    img = Image.open(io.BytesIO(cap.png)).convert("RGB")
    assert img.size[0] >= 1000 and img.size[1] >= 800
    # Not blank: the loading skeleton on white measures a variance of about 2-3, the drawn
    # page about 300.
    assert max(ImageStat.Stat(img).var) > 50, ImageStat.Stat(img).var
    # The series itself is drawn: enough pixels in the line colour, spread over the width.
    # (About 1,400 such pixels on the drawn page, none on the skeleton.)
    pixels = img.load()
    blue = [(x, y) for y in range(img.size[1]) for x in range(img.size[0])
            if _near(pixels[x, y], SERIES_BLUE)]
    assert len(blue) > 400, f"only {len(blue)} series-coloured pixels"
    xs = sorted(x for x, _ in blue)
    assert xs[-1] - xs[0] > img.size[0] // 3, "the series does not span the chart"
