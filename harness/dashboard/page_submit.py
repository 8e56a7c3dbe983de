"""Submit page: upload a kernel variant for scoring, behind a submission token.

The dashboard loads this file when the page is opened and calls `render(db_url)`. Uploads
go through exactly the checks of `fa-harness submit` (harness.submissions.submit): sizes, sources,
manifest, compile options, launch limits, an nvcc compile. A valid submission is queued
for a worker; a rejected one is recorded with its message. The page writes to the
database only through harness.submissions.submit, after the token has been verified.

Uploads are refused before they are read: the file uploader is drawn only once a valid
token has been entered, and the server takes no upload larger than the submission's total
size limit (Streamlit's `server.maxUploadSize`, which `fa-harness dashboard` sets:
harness.cli.cmd_dashboard.upload_limit_mb; Streamlit checks it on the request's length
before reading the body, and again while the body streams in). Every text a submitter wrote
(names, compiler messages quoting their files) is shown escaped, never as Markdown.
"""

from __future__ import annotations

import streamlit as st

from harness.dashboard.ui import md_escape

ACCEPTED_TYPES = ["cu", "cuh", "toml", "md", "txt"]


def _recent(engine, token_id: int) -> list[dict]:  # noqa: ANN001 - Engine
    from sqlalchemy import select

    from harness.records.db.engine import session_factory
    from harness.records.db.models import Submission

    with session_factory(engine)() as s:
        rows = s.execute(
            select(Submission.id, Submission.name, Submission.status, Submission.verdict,
                   Submission.score, Submission.message, Submission.created_at)
            .where(Submission.token_id == token_id)
            .order_by(Submission.id.desc()).limit(20)).all()
    return [dict(r._mapping) for r in rows]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def _verified(db_url: str | None, token: str):  # noqa: ANN202 - TokenInfo | None
    """The token's row, or None with the reason shown (unknown, revoked, no database)."""
    from harness.records.db import DatabaseError, open_db
    from harness.submissions.tokens import TokenError, verify_token

    try:
        db = open_db(db_url, create=False)
    except DatabaseError as e:
        st.error(f"The database cannot be used: {md_escape(e)}")
        return None
    try:
        return verify_token(db.engine, token)
    except TokenError as e:
        st.error(md_escape(e))
        return None
    finally:
        db.close()


def render(db_url: str | None = None) -> None:
    from harness.records.db import DatabaseError, open_db
    from harness.submissions import submit
    from harness.submissions.sources import MAX_FILE_BYTES, MAX_FILES, MAX_TOTAL_BYTES

    st.title("Submit a kernel")
    st.markdown(
        "Upload a variant folder's files (`manifest.toml` and its `.cu` sources) or one `.cu` "
        "whose manifest is in a leading `/* fa-harness manifest ... */` comment. Only CUDA "
        "source and the declarative manifest are accepted; includes are limited to "
        "`fa_harness.h`. A worker checks it on the full correctness grid with secret inputs, "
        "then times it against SDPA flash on the perf grid.")
    token = st.text_input("Submission token", type="password",
                          help="Ask an administrator: `fa-harness token create --name YOU`")
    name = st.text_input("Display name (optional)")
    limits = (f"at most {MAX_FILES} files, {_mib(MAX_FILE_BYTES)} each, "
              f"{_mib(MAX_TOTAL_BYTES)} in all")
    # The token first: nobody without one gets an uploader to send files to.
    info = _verified(db_url, token) if token else None
    uploads = None
    if info is not None:
        # The uploader's own size line reads its limit in whole megabytes: 1 (the per-file
        # limit, 1 MiB); the real limits are checked again on the server by `submit`.
        uploads = st.file_uploader("Kernel files", type=ACCEPTED_TYPES,
                                   accept_multiple_files=True,
                                   max_upload_size=max(1, MAX_FILE_BYTES >> 20),
                                   help=f"`.cu`, `.cuh`, `manifest.toml`: {limits}.")
    elif not token:
        st.info("Enter your submission token to upload files.")
    st.caption(f"Limits: {limits} (checked again when the submission is validated).")
    if not st.button("Submit", type="primary"):
        return
    if not token:
        st.error("A submission token is required.")
        return
    if info is None:
        return  # why is already shown under the token
    try:
        db = open_db(db_url, create=False)
    except DatabaseError as e:
        st.error(f"The database cannot be used: {md_escape(e)}")
        return
    try:
        if not uploads:
            st.error("Choose the kernel files to upload first.")
            return
        files, rejection = None, None
        try:
            files = submit.pack_upload((u.name, u.getvalue()) for u in uploads)
        except submit.Rejected as e:
            rejection = str(e)
        with st.spinner("Validating (manifest, sources, launch limits, nvcc compile)..."):
            try:
                res = submit.submit_files(db.engine, files, name=name or None,
                                          submitter=info.name, token_id=info.id,
                                          rejection=rejection)
            except submit.CannotCheck:
                # the host's fault: nothing stored against the submitter, no host detail
                st.error("This server cannot check submissions right now; nothing was "
                         "recorded. Please tell its operators.")
                return
        if res.accepted:
            st.success(f"Submission {res.id} queued. A worker will score it; its verdict "
                       "appears on the Leaderboard page.")
        else:
            st.error(f"Submission {res.id} rejected: {md_escape(res.message)}")
        recent = _recent(db.engine, info.id)
        if recent:
            st.subheader(f"Your recent submissions ({md_escape(info.name)})")
            st.dataframe(recent, hide_index=True)
    finally:
        db.close()


if __name__ == "__main__":  # `streamlit run dashboard/page_submit.py -- --db URL`
    import sys

    url = sys.argv[sys.argv.index("--db") + 1] if "--db" in sys.argv else None
    render(url)
