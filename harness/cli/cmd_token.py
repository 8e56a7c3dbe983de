"""`fa-harness token create|list|revoke`: submission tokens (stored only as sha256).

`token revoke NAME` revokes the live tokens of that name; `token revoke --id N` the one
token with that id. A name is never read as an id (a token may be named "1"): giving both,
or neither, is refused with exit 2."""

from __future__ import annotations

import argparse
import sys

from harness.cli.console import plain as text
from harness.cli.errors import UsageError


def _open(url: str | None):  # noqa: ANN202 - harness.records.db.Database
    from harness.records.db import DatabaseError, open_db

    try:
        # only commands that write a run create a database (`fa-harness db upgrade` does)
        return open_db(url, create=False)
    except DatabaseError as e:
        raise UsageError(str(e)) from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("token", help="create, list or revoke submission tokens",
                       description="Submission tokens. The token is printed once at creation; "
                                   "the database keeps only its sha256.")
    tsub = p.add_subparsers(dest="token_command", metavar="ACTION")
    tsub.required = True
    c = tsub.add_parser("create", help="create a token and print it (once)")
    c.add_argument("--name", required=True, help="who or what the token is for")
    c.add_argument("--db", help="database URL or SQLite path (default: FA_HARNESS_DB or the "
                                "default SQLite file)")
    c.set_defaults(func=_create)
    ls = tsub.add_parser("list", help="list tokens (names and ids, never the tokens)")
    ls.add_argument("--db")
    ls.set_defaults(func=_list)
    r = tsub.add_parser("revoke", help="revoke the tokens of a name, or one token by --id",
                        description="Revoke the live tokens named NAME, or the token with "
                                    "id N (--id). A NAME is always a name, even \"1\".")
    r.add_argument("name", nargs="?", metavar="NAME", help="the tokens' name")
    r.add_argument("--id", dest="token_id", type=int, metavar="N",
                   help="the token's id (as `token list` shows it) instead of a name")
    r.add_argument("--db")
    r.set_defaults(func=_revoke)


def _create(args: argparse.Namespace) -> int:
    from harness.submissions.tokens import TokenError, create_token

    db = _open(args.db)
    try:
        info, plain = create_token(db.engine, args.name)
    except TokenError as e:
        raise UsageError(str(e)) from None
    finally:
        db.close()
    print(plain)
    print(f"token {info.id} for {text(repr(info.name))} created; it is shown only now, "
          "store it safely", file=sys.stderr)
    return 0


def _list(args: argparse.Namespace) -> int:
    from harness.submissions.tokens import list_tokens

    db = _open(args.db)
    try:
        for t in list_tokens(db.engine):
            print(f"{t.id}\t{text(t.name)}\t{'revoked' if t.revoked else 'active'}")
    finally:
        db.close()
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from harness.submissions.tokens import revoke_token

    if (args.name is None) == (args.token_id is None):
        raise UsageError("name the tokens to revoke: NAME, or --id N (not both)")
    db = _open(args.db)
    try:
        n = revoke_token(db.engine, name=args.name, token_id=args.token_id)
    finally:
        db.close()
    if not n:
        what = (f"with id {args.token_id}" if args.token_id is not None
                else f"named {args.name!r} (to revoke by id: --id N)")
        raise UsageError(f"no active token {what}")
    print(f"revoked {n} token(s)")
    return 0
