"""The OpenAPI schema with what depends on this service's settings: the job spec's
``queue`` lists the queues a job may name here (``AMPTRAIN_QUEUES`` and their shape
queues), instead of a pattern any name matches."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from amptrain.core.settings import Settings


def install_service_schema(app: FastAPI, settings: Settings) -> None:
    """Make ``app.openapi()`` name this service's queues (built once, like FastAPI's own)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()  # FastAPI keeps it as app.openapi_schema: changed in place
        queue = schema["components"]["schemas"]["JobSpec"]["properties"]["queue"]
        queue["anyOf"] = [
            {"type": "string", "enum": list(settings.routable_queues)},
            {"type": "null"},
        ]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
