"""API bearer tokens, stored only as sha256 hex digests, with expiry and revocation.

Tokens are 256-bit random strings, so an unsalted fast hash is enough: there is
nothing to brute-force, and lookup by digest keeps verification one indexed query.
A token past its ``expires_at`` or with a ``revoked_at`` is refused by :func:`verify`.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.core.settings import Settings
from amptrain.store.models import ApiToken, utcnow

ADMIN_NAME = "admin"
TOKEN_PREFIX = "amp_"


class TokenNameTaken(ValueError):
    """A token with that name already exists."""


class TokenNotFound(LookupError):
    """No token has that name."""


_DURATION = re.compile(r"^\s*(\d{1,6})\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` -> a timedelta (at least one second)."""
    match = _DURATION.match(text)
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"{text[:20]!r} is not a duration like 30d, 12h, 90m, 2w or 45s")
    return timedelta(seconds=int(match.group(1)) * _UNIT_S[match.group(2)])


def is_active(row: ApiToken, now: datetime | None = None) -> bool:
    """Neither revoked nor expired."""
    now = now or utcnow()
    return row.revoked_at is None and (row.expires_at is None or row.expires_at > now)


def hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def generate_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def create_token(
    s: Session, name: str, is_admin: bool = False, expires_in: timedelta | None = None
) -> str:
    """Store a new token under ``name`` and return its plaintext (shown once, never stored).

    A name stays taken after its token is revoked or expires, so the jobs it owns never
    pass to a new token. ``expires_in``: refused after that long (default: never).
    """
    if s.scalar(sa.select(ApiToken.id).where(ApiToken.name == name)) is not None:
        raise TokenNameTaken(f"a token named {name!r} already exists")
    plaintext = generate_token()
    expires_at = utcnow() + expires_in if expires_in is not None else None
    s.add(
        ApiToken(
            name=name, token_hash=hash_token(plaintext), is_admin=is_admin, expires_at=expires_at
        )
    )
    s.flush()
    return plaintext


def verify(s: Session, plaintext: str) -> ApiToken | None:
    """The active (unexpired, unrevoked) token row for this bearer string, or None."""
    if not plaintext:
        return None
    return verify_digest(s, hash_token(plaintext))


def find(s: Session, plaintext: str) -> ApiToken | None:
    """The row for this bearer string whatever its state (to say why it was refused)."""
    return s.scalars(
        sa.select(ApiToken).where(ApiToken.token_hash == hash_token(plaintext))
    ).one_or_none()


def verify_digest(s: Session, digest: str) -> ApiToken | None:
    """Like :func:`verify` for a digest already computed (open streams re-check with it)."""
    row = s.scalars(sa.select(ApiToken).where(ApiToken.token_hash == digest)).one_or_none()
    return row if row is not None and is_active(row) else None


def list_tokens(s: Session) -> list[ApiToken]:
    """Every token, oldest first (digests included: callers show only the other columns)."""
    return list(s.scalars(sa.select(ApiToken).order_by(ApiToken.created_at, ApiToken.id)))


def revoke_token(s: Session, name: str) -> ApiToken:
    """Revoke the token called ``name`` (from now on every request with it gets 401).
    Revoking twice keeps the first time. Does not commit."""
    row = s.scalars(sa.select(ApiToken).where(ApiToken.name == name)).one_or_none()
    if row is None:
        raise TokenNotFound(f"no token named {name!r}")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    s.flush()
    return row


def ensure_admin_token(s: Session, settings: Settings) -> str | None:
    """Make sure an admin token exists.

    With ``AMPTRAIN_ADMIN_TOKEN`` set, the ``admin`` row takes that value and None is
    returned. Otherwise a token is generated once, saved to ``settings.admin_token_file``
    (mode 0600) and returned, so the caller prints it once; later calls reuse the file
    and return None. Does not commit.
    """
    configured = settings.admin_token.get_secret_value() if settings.admin_token else None
    if configured:
        _upsert_admin(s, configured)
        return None
    path = settings.admin_token_file
    existing = s.scalars(sa.select(ApiToken).where(ApiToken.name == ADMIN_NAME)).one_or_none()
    if path.exists():
        _upsert_admin(s, path.read_text().strip())
        return None
    if existing is not None:
        return None  # created earlier (perhaps with AMPTRAIN_ADMIN_TOKEN); nothing to print
    plaintext = generate_token()
    _write_private(path, plaintext)
    _upsert_admin(s, plaintext)
    return plaintext


def _upsert_admin(s: Session, plaintext: str) -> None:
    digest = hash_token(plaintext)
    row = s.scalars(sa.select(ApiToken).where(ApiToken.name == ADMIN_NAME)).one_or_none()
    if row is None:
        s.add(ApiToken(name=ADMIN_NAME, token_hash=digest, is_admin=True))
    elif row.token_hash != digest:
        # A new value is a new token: it starts active. The same value stays revoked, so
        # a restart never brings a revoked admin token back.
        row.token_hash, row.is_admin, row.revoked_at, row.expires_at = digest, True, None, None
    s.flush()


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL: never overwrite a token another process just wrote; 0600 from the first byte.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
