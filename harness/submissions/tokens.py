"""Submission tokens: created once, shown once, stored only as a sha256.

A token is 32 random bytes in URL-safe base64 behind a fixed prefix ("fah_"), so that a
leaked one is easy to recognise in logs. The database holds `sha256(token)`; checking a
token hashes what the user sent and looks the hash up, so a database dump gives no usable
token. Revoked tokens stay in the table (submissions keep pointing at them).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import Engine, select

from harness.records.db.engine import session_factory
from harness.records.db.models import ApiToken

TOKEN_PREFIX = "fah_"
MAX_NAME_LEN = 255
# A token's name is who it is for, shown on the leaderboard as the submitter: letters,
# digits, and the punctuation of a person's or a machine's name, matched whole (\Z, not
# $: a name ending in a newline is refused, not stored with it).
NAME_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9 ._@+-]{{0,{MAX_NAME_LEN - 1}}}\Z")


class TokenError(ValueError):
    """A token that is unknown, revoked or malformed, or a bad token name."""


@dataclass(frozen=True)
class TokenInfo:
    id: int
    name: str
    revoked: bool


def hash_token(token: str) -> str:
    return hashlib.sha256(token.strip().encode()).hexdigest()


def create_token(engine: Engine, name: str) -> tuple[TokenInfo, str]:
    """Store a new token under `name`; returns its row and the plaintext (shown once)."""
    if not NAME_RE.match(name) or name != name.strip():
        raise TokenError(f"token name must be 1..{MAX_NAME_LEN} letters, digits, spaces or "
                         f"'._@+-', starting with a letter or digit (got {name!r})")
    plain = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with session_factory(engine)() as s, s.begin():
        row = ApiToken(name=name, token_hash=hash_token(plain), revoked=False)
        s.add(row)
        s.flush()
        info = TokenInfo(row.id, row.name, row.revoked)
    return info, plain


def verify_token(engine: Engine, token: str | None) -> TokenInfo:
    """The token's row, or TokenError naming why it is not accepted."""
    if not token or not token.strip():
        raise TokenError("a submission token is required (fa-harness token create --name N)")
    if not token.strip().startswith(TOKEN_PREFIX):
        raise TokenError(f"not a submission token (tokens start with {TOKEN_PREFIX!r})")
    with session_factory(engine)() as s:
        row = s.scalars(select(ApiToken).where(ApiToken.token_hash == hash_token(token))).first()
        if row is None:
            raise TokenError("unknown submission token")
        if row.revoked:
            raise TokenError(f"submission token {row.name!r} has been revoked")
        return TokenInfo(row.id, row.name, row.revoked)


def revoke_token(engine: Engine, *, name: str | None = None, token_id: int | None = None
                 ) -> int:
    """Revoke every live token with this name, or the one with this id; returns how many.
    Exactly one of the two is given: a name that looks like a number ("1") is a name, never
    an id, so the caller says which it means."""
    if (name is None) == (token_id is None):
        raise TokenError("revoke by name or by id, exactly one of them")
    with session_factory(engine)() as s, s.begin():
        q = select(ApiToken).where(ApiToken.revoked.is_(False))
        if token_id is not None:
            q = q.where(ApiToken.id == token_id)
        else:
            q = q.where(ApiToken.name == name)
        rows = list(s.scalars(q))
        for row in rows:
            row.revoked = True
        return len(rows)


def list_tokens(engine: Engine) -> list[TokenInfo]:
    with session_factory(engine)() as s:
        return [TokenInfo(r.id, r.name, r.revoked)
                for r in s.scalars(select(ApiToken).order_by(ApiToken.id))]
