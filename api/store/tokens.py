"""API bearer tokens, stored only as sha256 hex digests.

Tokens are 256-bit random strings, so an unsalted fast hash is enough: there is
nothing to brute-force, and lookup by digest keeps verification one indexed query.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session

from api.core.settings import Settings
from api.store.models import ApiToken

ADMIN_NAME = "admin"
TOKEN_PREFIX = "amp_"


class TokenNameTaken(ValueError):
    """A token with that name already exists."""


def hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def generate_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def create_token(s: Session, name: str, is_admin: bool = False) -> str:
    """Store a new token under ``name`` and return its plaintext (shown once, never stored)."""
    if s.scalar(sa.select(ApiToken.id).where(ApiToken.name == name)) is not None:
        raise TokenNameTaken(f"a token named {name!r} already exists")
    plaintext = generate_token()
    s.add(ApiToken(name=name, token_hash=hash_token(plaintext), is_admin=is_admin))
    s.flush()
    return plaintext


def verify(s: Session, plaintext: str) -> ApiToken | None:
    """The token row for this bearer string, or None."""
    if not plaintext:
        return None
    return s.scalars(
        sa.select(ApiToken).where(ApiToken.token_hash == hash_token(plaintext))
    ).one_or_none()


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
    else:
        row.token_hash, row.is_admin = digest, True
    s.flush()


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL: never overwrite a token another process just wrote; 0600 from the first byte.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
