"""Uploads to the dashboard's Submit page are refused before they are read: no uploader
without a valid token (AppTest), and the served app, started the way `fa-harness dashboard`
starts it, answers 413 to an upload over the submission size limit instead of reading
5 or 150 MiB into the server's memory (Streamlit's own default takes 200 MB from anyone)."""

from __future__ import annotations

import http.client
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.records.db import open_db
from harness.submissions.sources import MAX_TOTAL_BYTES
from harness.submissions.tokens import create_token

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest
PAGE = Path(__file__).resolve().parent.parent / "harness" / "dashboard" / "page_submit.py"
MiB = 2**20


def _app(url: str):
    def page(url: str, path: str) -> None:
        import runpy

        runpy.run_path(path, run_name="page")["render"](url)

    return AppTest.from_function(page, args=(url, str(PAGE)), default_timeout=60)


@pytest.fixture
def db(tmp_path):
    d = open_db(str(tmp_path / "upload.sqlite"))
    yield d
    d.close()


def test_no_uploader_without_a_valid_token(db):
    _, plain = create_token(db.engine, "dora")
    at = _app(db.url).run()
    assert not at.exception and at.get("file_uploader") == []
    at.text_input[0].input("fah_not-a-real-token").run()
    assert at.get("file_uploader") == [] and "unknown submission token" in at.error[0].value
    at.text_input[0].input(plain).run()
    assert len(at.get("file_uploader")) == 1 and not at.error


def test_the_command_sets_the_upload_limit():
    from harness.cli import build_parser, cmd_dashboard

    cmd = cmd_dashboard.command(build_parser().parse_args(["dashboard"]))
    limit = int(cmd[cmd.index("--server.maxUploadSize") + 1])
    assert limit == cmd_dashboard.upload_limit_mb() and limit * MiB >= MAX_TOTAL_BYTES
    assert limit <= 4  # a few MiB, not Streamlit's 200


# ------------------------------------------------------------------ the served app


@contextmanager
def _session(port: int) -> Iterator[str]:
    """A browser's session with the app, open while the block runs: its session id."""
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{port}/_stcore/stream", subprotocols=["streamlit"],
                 open_timeout=30) as ws:
        msg = BackMsg()
        msg.rerun_script.query_string = "page=submit"
        ws.send(msg.SerializeToString())
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            fm = ForwardMsg()
            fm.ParseFromString(ws.recv(timeout=60))
            if fm.WhichOneof("type") == "new_session":
                yield fm.new_session.initialize.session_id
                return
        raise TimeoutError("the app gave no session")


def _put(port: int, session_id: str, size: int) -> int:
    """PUT one file of `size` bytes to the upload endpoint as the browser would (its XSRF
    cookie and header); the HTTP status."""
    from streamlit.web.server.starlette.starlette_app_utils import generate_xsrf_token_string

    xsrf = generate_xsrf_token_string()
    boundary = "b" + uuid.uuid4().hex
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="k.cu"\r\nContent-Type: text/plain\r\n\r\n').encode() \
        + b"a" * size + f"\r\n--{boundary}--\r\n".encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("PUT", f"/_stcore/upload_file/{session_id}/{uuid.uuid4()}", body=body,
                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}",
                              "X-Xsrftoken": xsrf, "Cookie": f"_streamlit_xsrf={xsrf}"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (BrokenPipeError, ConnectionResetError):
        return 413  # refused (and the connection closed) before the body was sent
    finally:
        conn.close()


def test_served_app_refuses_oversized_uploads_unread(db):
    import dashboard_server

    with dashboard_server.serve(db.url, timeout_s=180) as srv, _session(srv.port) as sid:
        before, _ = srv.rss_bytes()
        # a small file goes through: the request is the browser's, only its size differs
        assert _put(srv.port, sid, 1000) == 204
        assert _put(srv.port, sid, 5 * MiB) == 413
        assert _put(srv.port, sid, 150 * MiB) == 413
        after, _ = srv.rss_bytes()
    assert after - before < 40 * MiB, (before, after)
