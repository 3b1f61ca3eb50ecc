"""HTTP routes, one module per resource; :data:`ROUTERS` is what the app mounts."""

from __future__ import annotations

from fastapi import APIRouter

from amptrain.server.web.routes import (
    alerts,
    catalog,
    checkpoints,
    comparisons,
    export,
    forks,
    guide,
    health,
    jobs,
    live,
    me,
    metrics,
    telemetry,
    ui,
    workers,
)

ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    metrics.router,
    catalog.router,
    me.router,
    jobs.router,
    forks.router,
    telemetry.router,
    checkpoints.router,
    live.router,
    workers.router,
    comparisons.router,
    export.router,
    alerts.router,
    ui.router,
    guide.router,
)
