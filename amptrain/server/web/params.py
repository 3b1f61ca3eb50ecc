"""Query parameters that several routes share, declared once as typed aliases (as
:mod:`amptrain.server.web.deps` declares the dependencies): the step window of a
downsampled read (``/metrics`` and ``/evals`` with ``max_points``), and the cursor pages
of a job's series (``/metrics``, ``/evals``) and its live watchers (``/ws``, ``/stream``),
which resume after the same cursor."""

from __future__ import annotations

from typing import Annotated, NamedTuple

from fastapi import Depends, Query

from amptrain.store.history.points import Attempts

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

AfterCursor = Annotated[
    str | None,
    Query(max_length=48, description="Resume after this cursor (``next_cursor`` of a page)."),
]
"""A stream entry id ``ms-seq``: the one cursor of points, evaluations and live messages."""
PageLimit = Annotated[int, Query(ge=1, le=10_000, description="Items per page.")]
AttemptsQuery = Annotated[
    Attempts,
    Query(
        description="``effective``: per step (evaluations: per step and name) only the newest "
        "attempt's; ``all``: every attempt's."
    ),
]


class CursorQuery(NamedTuple):
    """A cursor page's parameters as a request gave them (``after`` not parsed yet)."""

    after: str | None
    limit: int
    attempts: Attempts


def cursor_query(
    after: AfterCursor = None, limit: PageLimit = 1000, attempts: AttemptsQuery = "effective"
) -> CursorQuery:
    return CursorQuery(after, limit, attempts)


CursorParams = Annotated[CursorQuery, Depends(cursor_query)]
"""``after``, ``limit`` and ``attempts`` of a route that pages through a series."""
