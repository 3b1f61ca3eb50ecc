"""Request dependencies as typed aliases: ``SessionDep``, ``CurrentUser``, ``ServicesDep``.

One database session per request, and this is the one place that commits:
the session dependency commits after the handler returned (before the response
is sent, hence ``scope="function"``) and rolls back when anything raised.
(Authentication ends its read-only transaction early: :func:`release_connection`.)
Work that must only happen once the data is durable (dispatching a job,
setting a Redis cancel key) is registered with :func:`after_commit`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.requests import HTTPConnection

from amptrain.contract.cursor import Cursor, CursorError
from amptrain.server.runtime import Services
from amptrain.server.web.auth import Principal, authenticate, refusal
from amptrain.server.web.errors import (
    AppError,
    NotFound,
    TooMany,
    Unauthorized,
    ValidationFailed,
    clip,
)
from amptrain.store.jobs import get_job
from amptrain.store.models import Job

log = logging.getLogger(__name__)

_AFTER_COMMIT = "amptrain.after_commit"


async def get_services(request: Request) -> Services:
    # async: a sync dependency costs a hop to a worker thread and back for an attribute read.
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_session(services: ServicesDep) -> Iterator[Session]:
    """The request's session: commit on success, roll back on error, then run after-commit hooks."""
    session = services.session_factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        hooks: list[Callable[[], object]] = session.info.pop(_AFTER_COMMIT, [])
        session.close()
    for hook in hooks:
        try:
            hook()
        except Exception:
            # The transaction is durable; a failed side effect is retried by its own loop.
            log.exception("after-commit hook failed")


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def after_commit(session: Session, hook: Callable[[], object]) -> None:
    """Run ``hook`` once this request's transaction has committed (never on rollback)."""
    session.info.setdefault(_AFTER_COMMIT, []).append(hook)


_bearer = HTTPBearer(auto_error=False, description="An amptrain API token.")


_READS = frozenset({"GET", "HEAD", "OPTIONS"})


def get_current_user(
    request: Request,
    session: SessionDep,
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller behind ``Authorization: Bearer TOKEN``; 401 otherwise (missing, unknown,
    expired or revoked), or 429 instead once its address failed too often. The token is
    checked first: a valid one always passes, whatever its address did. Writes count
    against the caller's rate limit (429)."""
    token = credentials.credentials if credentials else None
    principal = authenticate(session, token)
    if principal is None:
        raise failed_authentication(services, client_address(request), refusal(session, token))
    release_connection(session)
    if request.method not in _READS:
        charge_writes(services, principal, 1)
    return principal


def client_address(conn: HTTPConnection) -> str:
    """The caller's address: the peer's, or what a trusted proxy forwarded (uvicorn puts it
    in the scope only for ``AMPTRAIN_FORWARDED_ALLOW_IPS``)."""
    return conn.client.host if conn.client else "unknown"


def failed_authentication(services: Services, address: str, reason: str) -> AppError:
    """Count a failed authentication from ``address`` (a request, an SSE stream or a
    WebSocket handshake alike) and return what answers it: 401 saying ``reason``, or 429
    with ``Retry-After`` while the address is over ``AMPTRAIN_AUTH_FAILURE_RATE_LIMIT``.
    Blocking (Redis)."""
    failures = services.auth_failures
    wait = failures.blocked_for(address)
    if wait is None:
        refused = failures.failed(address, reason)
        wait = refused.retry_after_s if refused is not None else None
    return Unauthorized(reason) if wait is None else _auth_throttled(wait, failures.limit)


def _auth_throttled(retry_after_s: int, limit: str) -> TooMany:
    return TooMany(
        {
            "message": "too many failed authentications from this address; "
            f"retry in {retry_after_s}s",
            "limit": limit,
        },
        headers={"Retry-After": str(retry_after_s)},
    )


def charge_writes(services: Services, principal: Principal, writes: int) -> None:
    """Count ``writes`` against the caller's write rate; 429 with ``Retry-After`` beyond it.
    Every request counts one; a request that creates several jobs charges the rest."""
    refused = services.write_limiter.hit(principal.name, writes)
    if refused is not None:
        raise TooMany(
            {
                "message": f"write rate limit {refused.limit} reached; "
                f"retry in {refused.retry_after_s}s",
                "limit": refused.limit,
            },
            headers={"Retry-After": str(refused.retry_after_s)},
        )


CurrentUser = Annotated[Principal, Depends(get_current_user)]


def release_connection(session: Session) -> None:
    """End the session's read-only transaction so its pooled connection goes back now.

    WHY: FastAPI runs each sync dependency, the handler and then the validation of its
    response in separate hops to the worker-thread pool (40 threads); the session
    dependency commits only after the last. A request that kept its connection across
    a hop held it while waiting for a thread, and with more requests in flight than
    pooled connections every thread ended up waiting for a connection held by a request
    waiting for a thread: 30 s stalls (the pool timeout) under load (bench/load.py).
    Authentication calls it, and read-only handlers once they have read everything
    (objects stay usable: sessions do not expire them on commit). A session with
    pending writes keeps its transaction.
    """
    if not (session.new or session.dirty or session.deleted):
        session.commit()


def visible_job(session: Session, user: Principal, job_id: str) -> Job:
    """The job if it exists and the caller may see it; 404 otherwise (never 403, so ids don't leak)."""
    job = get_job(session, job_id)
    if job is None or not user.can_see(job):
        raise NotFound(f"no job {clip(job_id)}")
    return job


def parse_cursor(text: str | None, field: str) -> Cursor | None:
    """The telemetry cursor a client passed back (None when it passed none); a bad one is a
    422 naming ``field`` (``query.after``, ``header.Last-Event-ID``)."""
    try:
        return None if text is None else Cursor.parse(text)
    except CursorError as exc:
        raise ValidationFailed.one(field, str(exc)) from None
