"""Who is calling: bearer tokens checked against the hashed ``api_tokens`` table.

Shared by HTTP (:mod:`amptrain.server.web.deps`) and the live routes' WebSocket handshakes
(:mod:`amptrain.server.web.routes.live`), so both authenticate and authorize jobs the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy.orm import Session

from amptrain.store import tokens


class Owned(Protocol):
    """Anything a user owns: a job, a comparison."""

    @property
    def owner(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: the token's name (jobs' ``owner``) and whether it is an admin."""

    name: str
    is_admin: bool = False
    token_hash: str = ""
    """Open streams re-check the token by it (revoked or expired since they opened?)."""
    created_at: datetime | None = None
    expires_at: datetime | None = None

    def can_see(self, thing: Owned) -> bool:
        """Admins see every job and comparison; everyone else only their own."""
        return self.is_admin or thing.owner == self.name

    @property
    def owner_filter(self) -> str | None:
        """Whose rows a listing shows: None (everyone's) for an admin, else the caller's own."""
        return None if self.is_admin else self.name


def bearer_token(authorization: str | None) -> str | None:
    """The token in an ``Authorization: Bearer TOKEN`` header value, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def authenticate(s: Session, token: str | None) -> Principal | None:
    """The principal a plaintext token belongs to, or None when it is unknown, expired
    or revoked."""
    if not token:
        return None
    row = tokens.verify(s, token)
    if row is None:
        return None
    return Principal(
        name=row.name,
        is_admin=bool(row.is_admin),
        token_hash=row.token_hash,
        created_at=row.created_at,
        expires_at=row.expires_at,
    )


def refusal(s: Session, token: str | None) -> str:
    """Why :func:`authenticate` refused ``token``: missing, unknown, expired or revoked."""
    if not token:
        return "missing bearer token"
    row = tokens.find(s, token)
    if row is None:
        return "unknown bearer token"
    if row.revoked_at is not None:
        return f"token {row.name!r} was revoked"
    return f"token {row.name!r} has expired"


def still_valid(s: Session, principal: Principal) -> bool:
    """The principal's token is still active (not revoked, not expired)."""
    return tokens.verify_digest(s, principal.token_hash) is not None
