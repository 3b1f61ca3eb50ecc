"""The dashboard: static ES modules and CSS under ``/ui/``, no build step.

The pages are a client of the public API only (they call the same endpoints as
``curl``). Caching: the vendored chart library carries its version in its file
name, so it is cached for a year; everything else is revalidated on each load
(``no-cache`` + ETag: a 304 costs a round trip, never a stale page after an
upgrade). A Content-Security-Policy keeps the pages to their own origin.
"""

from __future__ import annotations

import os
from ipaddress import ip_address
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from amptrain.server.web.deps import ServicesDep

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)

router = APIRouter(include_in_schema=False)


class _Static(StaticFiles):
    """StaticFiles with the dashboard's cache and security headers."""

    def file_response(
        self,
        full_path: str | os.PathLike[str],
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        vendored = Path(full_path).parent.name == "vendor"
        response.headers["Cache-Control"] = IMMUTABLE if vendored else REVALIDATE
        response.headers["X-Content-Type-Options"] = "nosniff"
        if str(full_path).endswith(".html"):
            response.headers["Content-Security-Policy"] = CSP
            response.headers["Referrer-Policy"] = "no-referrer"
        return response


_static = _Static(directory=STATIC_DIR)


@router.get("/")
@router.get("/ui")
def to_dashboard() -> RedirectResponse:
    """The service's root opens the dashboard."""
    return RedirectResponse("/ui/", status_code=307)


TOKEN_COMMAND = "amptrain token create NAME"
"""Makes another API token (``cli/tokens.py``), run where the service's database is reachable."""


@router.get("/ui/signin-hints.json")
def signin_hints(request: Request, services: ServicesDep) -> dict[str, Any]:
    """What the sign-in page tells a person about where a token comes from: the command that
    makes one and, for a browser on the service's own machine, the file ``amptrain up`` saved
    the admin token to (its path is nobody else's business, and means nothing elsewhere)."""
    token_file = services.settings.admin_token_file
    local = request.client is not None and _loopback(request.client.host)
    return {
        "token_file": str(token_file) if local and token_file.is_file() else None,
        "create_command": TOKEN_COMMAND,
    }


def _loopback(host: str) -> bool:
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


@router.api_route("/ui/{path:path}", methods=["GET", "HEAD"])
async def dashboard_file(path: str, request: Request) -> Response:
    """``/ui/`` is the single page (its routes live in the URL fragment); the rest are its
    modules, styles and the vendored chart library."""
    return await _static.get_response(path or "index.html", request.scope)
