"""Liveness and readiness; the only endpoints without authentication."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from amptrain.server.web.deps import ServicesDep
from amptrain.server.web.errors import Unavailable, error_responses
from amptrain.store.db import ping

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the process serves")
def healthz() -> dict[str, str]:
    """The process is up and serving."""
    return {"status": "ok"}


@router.get(
    "/readyz", responses=error_responses(503), summary="Readiness: database and Redis reachable"
)
def readyz(services: ServicesDep) -> dict[str, Any]:
    """The database and Redis are reachable; 503 naming the failing one otherwise."""
    checks = {"database": _check_database(services), "redis": _check_redis(services)}
    if any(result != "ok" for result in checks.values()):
        raise Unavailable(checks)
    return {"status": "ready", **checks}


def _check_database(services: ServicesDep) -> str:
    try:
        ping(services.engine)
    except Exception as exc:
        return f"error: {type(exc).__name__}"
    return "ok"


def _check_redis(services: ServicesDep) -> str:
    try:
        services.redis.ping()
    except Exception as exc:
        return f"error: {type(exc).__name__}"
    return "ok"
