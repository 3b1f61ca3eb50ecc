"""``GET /me``: who the token belongs to, when it expires, and the caller's limits."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel

from amptrain.server.web.deps import CurrentUser, ServicesDep, SessionDep
from amptrain.server.web.errors import error_responses
from amptrain.store import quotas

router = APIRouter(tags=["tokens"])


class LimitsOut(BaseModel):
    active_jobs: int
    """Queued, running or cancelling jobs the caller holds now."""
    max_active_jobs: int | None
    """More active jobs than this are refused (429); null for admins (exempt)."""
    max_live_connections: int | None
    """Concurrent WebSocket + SSE watchers; null for admins (exempt)."""
    write_rate: str
    """Writes allowed per window (``limits`` notation, e.g. ``120/minute``)."""


class MeOut(BaseModel):
    name: str
    """The token's name: the ``owner`` of the jobs it submits."""
    admin: bool
    created_at: datetime | None
    expires_at: datetime | None
    """After this the token gets 401; null: never."""
    limits: LimitsOut


@router.get(
    "/me",
    response_model=MeOut,
    responses=error_responses(401),
    summary="The caller: who the token belongs to",
)
def read_me(user: CurrentUser, session: SessionDep, services: ServicesDep) -> MeOut:
    """The caller's token: name, role, expiry, and the per-user limits with current use."""
    settings = services.settings
    return MeOut(
        name=user.name,
        admin=user.is_admin,
        created_at=user.created_at,
        expires_at=user.expires_at,
        limits=LimitsOut(
            active_jobs=quotas.active_jobs(session, user.name),
            max_active_jobs=None if user.is_admin else settings.max_active_jobs_per_user,
            max_live_connections=(
                None if user.is_admin else settings.max_live_connections_per_user
            ),
            write_rate=settings.write_rate_limit,
        ),
    )
