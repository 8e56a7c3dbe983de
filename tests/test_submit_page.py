"""The dashboard's Submit page, headless (Streamlit AppTest): the token gate."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.records.db import open_db
from harness.submissions.tokens import create_token

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest
PAGE = Path(__file__).resolve().parent.parent / "harness" / "dashboard" / "page_submit.py"


def _app(url: str):
    def page(url: str, path: str) -> None:
        import runpy

        runpy.run_path(path, run_name="page")["render"](url)

    return AppTest.from_function(page, args=(url, str(PAGE)), default_timeout=60)


@pytest.fixture
def db(tmp_path):
    d = open_db(str(tmp_path / "page.sqlite"))
    yield d
    d.close()


def test_page_renders_without_submitting(db):
    at = _app(db.url).run()
    assert not at.exception
    assert at.title[0].value == "Submit a kernel"
    assert not at.error


def test_missing_and_bad_tokens_refused(db):
    at = _app(db.url).run()
    at.button[0].click().run()
    assert "token is required" in at.error[0].value
    at.text_input[0].input("fah_not-a-real-token").run()
    at.button[0].click().run()
    assert "unknown submission token" in at.error[0].value


def test_valid_token_without_files(db):
    _, plain = create_token(db.engine, "carol")
    at = _app(db.url).run()
    at.text_input[0].input(plain).run()
    at.button[0].click().run()
    assert "Choose the kernel files" in at.error[0].value
