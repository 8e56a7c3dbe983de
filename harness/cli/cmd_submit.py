"""`fa-harness submit PATH`: validate a kernel variant and queue it for scoring.

Exit codes: 0 queued (with --wait: scored), 1 with --wait: scored with another verdict
(the forward's; a declared backward's own verdict is printed after it), 2 rejected (the
message says what is wrong) or bad arguments/token/database.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from harness.cli._discoveryopt import add_discovery_options
from harness.cli.console import plain
from harness.cli.errors import EXIT_FAIL, EXIT_OK, EXIT_USAGE, UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "submit", help="validate a kernel variant and queue it for scoring",
        description="Validate a variant folder (manifest.toml + .cu) or a single .cu with a "
                    "'/* fa-harness manifest ... */' header, and queue it for a worker. A "
                    "rejected submission is recorded with verdict 'rejected' and exits 2.")
    p.add_argument("path", help="variant folder, single .cu file, or the name of a "
                                "discovered variant (see `fa-harness kernels`)")
    p.add_argument("--name", help="display name (default: the manifest's name)")
    p.add_argument("--wait", action="store_true", help="wait for the verdict and print it")
    p.add_argument("--wait-timeout", type=float, default=None, metavar="S",
                   help="give up waiting after S seconds (exit 1)")
    p.add_argument("--db", help="database URL or SQLite path")
    p.add_argument("--token", help="submission token (default: FA_HARNESS_TOKEN); when "
                                   "given it must be valid and names the submitter")
    p.add_argument("--compile-timeout", type=float, default=None, metavar="S")
    add_discovery_options(p)
    p.set_defaults(func=_submit)


def _submit(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harness.records.db import DatabaseError, open_db
    from harness.submissions import submit
    from harness.submissions.tokens import TokenError, verify_token

    if not Path(args.path).exists():
        # Not a path: the name of a discovered variant (--kernels-dir, FA_HARNESS_KERNELS,
        # pyproject.toml), else a typo, which is not a submission.
        from harness.candidates.discovery import variant_path

        found = variant_path(args.path)
        if found is None:
            raise UsageError(f"{args.path}: no such file or folder, nor a discovered "
                             f"variant of that name")
        args.path = str(found)
    try:
        db = open_db(args.db)
    except DatabaseError as e:
        raise UsageError(str(e)) from None
    try:
        token = args.token or os.environ.get("FA_HARNESS_TOKEN")
        token_id, submitter = None, submit.default_submitter()
        if token:
            try:
                info = verify_token(db.engine, token)
            except TokenError as e:
                raise UsageError(str(e)) from None
            token_id, submitter = info.id, info.name
        files, rejection = None, None
        try:
            files = submit.pack_path(args.path)
        except submit.Rejected as e:
            rejection = str(e)
        kw = {}
        if args.compile_timeout:
            kw["compile_timeout_s"] = args.compile_timeout
        try:
            res = submit.submit_files(db.engine, files, name=args.name, submitter=submitter,
                                      token_id=token_id, rejection=rejection, **kw)
        except submit.CannotCheck as e:
            raise UsageError(str(e)) from None
        if not res.accepted:
            print(f"fa-harness submit: rejected (submission {res.id}): "
                  f"{plain(res.message, lines=True)}",
                  file=sys.stderr)
            return EXIT_USAGE
        print(f"submission {res.id} queued")
        if not args.wait:
            return EXIT_OK
        return _wait(db.engine, res.id, args.wait_timeout)
    finally:
        db.close()


def _wait(engine, sid: int, timeout: float | None) -> int:  # noqa: ANN001 - Engine
    from harness.records.db.engine import session_factory
    from harness.records.db.models import Submission

    t0 = time.monotonic()
    last = None
    while True:
        with session_factory(engine)() as s:
            row = s.get(Submission, sid)
            status, verdict, score, message = row.status, row.verdict, row.score, row.message
        if status != last:
            if status == "running":
                print(f"submission {sid}: running")
            last = status
        if status in ("done", "error"):
            score_s = f" score {score:.4f}" if score is not None else ""
            print(f"submission {sid}: {verdict}{score_s}: {plain(message, lines=True)}")
            _print_backward(engine, sid)
            # The exit status is the forward's: the backward is ranked on its own board.
            return EXIT_OK if verdict == "scored" else EXIT_FAIL
        if timeout is not None and time.monotonic() - t0 > timeout:
            print(f"submission {sid}: still {status} after {timeout:g} s", file=sys.stderr)
            return EXIT_FAIL
        time.sleep(1.0)


def _print_backward(engine, sid: int) -> None:  # noqa: ANN001 - Engine
    """The submission's backward entry, when it declared a backward."""
    from sqlalchemy import select

    from harness.records.db.engine import session_factory
    from harness.records.db.models import SubmissionPass

    with session_factory(engine)() as s:
        row = s.scalars(select(SubmissionPass).where(SubmissionPass.submission_id == sid,
                                                     SubmissionPass.pass_name == "bwd")).first()
        if row is None:
            return
        score_s = f" score {row.score:.4f}" if row.score is not None else ""
        print(f"submission {sid} backward: {row.verdict}{score_s}: "
              f"{plain(row.message, lines=True)}")

