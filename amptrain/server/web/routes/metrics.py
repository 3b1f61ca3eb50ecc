"""``GET /metrics``: Prometheus text format, without authentication.

Like the health checks, it is meant for scrapers inside the cluster: it holds
counts and latencies, never job contents, specs or tokens. Do not route it
through a public ingress (deploy/README.md). Not to be confused with
``GET /jobs/{id}/metrics``, a job's telemetry.
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from amptrain.server.observability import exposition
from amptrain.server.web.deps import ServicesDep

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response, summary="Prometheus metrics")
def prometheus_metrics(services: ServicesDep) -> Response:
    """Jobs by status, queue depth, dispatch latency, recorder, watchers, request latency."""
    return Response(exposition(services.metrics_registry), media_type=CONTENT_TYPE_LATEST)
