"""The FastAPI application: ``create_app(settings)`` is the uvicorn factory.

The lifespan builds :class:`~amptrain.server.runtime.Services` (the sole owner of
everything the process holds: engine, Redis, recorder, dispatcher, live hub,
metrics) and closes it on shutdown. Routers live in :mod:`amptrain.server.web.routes`;
errors map to ``{"error", "detail"}`` in :mod:`amptrain.server.web.errors`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

import anyio
from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from amptrain.core.settings import Settings, get_settings
from amptrain.server import observability
from amptrain.server.runtime import Services
from amptrain.server.web.body_limit import BodyLimit
from amptrain.server.web.docs_csp import DocsPolicy
from amptrain.server.web.errors import install_error_handlers
from amptrain.server.web.openapi import install_service_schema
from amptrain.server.web.routes import ROUTERS
from amptrain.server.web.security_headers import SecurityHeaders

DOCS_ASSETS = "/docs/assets"
"""Where the API reference pages' scripts and styles are served from."""


def _version() -> str:
    try:
        return version("amptrain")
    except PackageNotFoundError:
        return "0"


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the API for ``settings`` (default: from the environment)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = await anyio.to_thread.run_sync(Services.create, settings)
        app.state.services = services
        try:
            await anyio.to_thread.run_sync(services.start)
            yield
        finally:
            await services.aclose()

    # /docs and /redoc with their scripts and styles served from the fastapi-offline
    # package, not a CDN: the README sends users there, often from a machine offline.
    app = FastAPIOffline(
        static_url=DOCS_ASSETS,
        title="amptrain",
        version=_version(),
        summary="Declarative PyTorch training jobs with automatic mixed precision.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    install_service_schema(app, settings)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(DocsPolicy)  # /docs and /redoc: their Content-Security-Policy
    app.add_middleware(SecurityHeaders)  # outside BodyLimit: its 413 gets them too
    app.add_middleware(observability.RequestMetrics)
    for router in ROUTERS:
        app.include_router(router)
    return app
