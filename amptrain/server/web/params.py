"""Query parameters that several routes share, declared once as typed aliases (as
:mod:`amptrain.server.web.deps` declares the dependencies): the step window of a
downsampled read (``/metrics`` and ``/evals`` with ``max_points``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

STEP_MAX = 2**31 - 1
"""Steps are 32-bit columns (PostgreSQL casts a bound step to int4: larger is an error)."""
MAX_POINTS = 10_000
"""The most items a downsampled read may ask for."""

FromStep = Annotated[
    int | None,
    Query(
        ge=0,
        le=STEP_MAX,
        description="With ``max_points``: only steps from this one on (a zoomed chart's "
        "window; at full resolution when it holds at most ``max_points`` items).",
    ),
]
ToStep = Annotated[
    int | None,
    Query(
        ge=0,
        le=STEP_MAX,
        description="With ``max_points``: only steps up to this one (inclusive).",
    ),
]
