"""A job's history: metric points (cursor = stream entry id) and lifecycle events (cursor = id)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.contracts.cursor import Cursor, CursorError
from api.store.downsample import downsample, parse_fields, select_fields
from api.store.events import event_page
from api.store.metrics import Attempts, metric_page
from api.web.deps import CurrentUser, SessionDep, visible_job
from api.web.errors import ValidationFailed
from api.web.schemas import EventOut, EventPage, MetricPage

router = APIRouter(prefix="/jobs", tags=["telemetry"])


@router.get("/{job_id}/metrics", response_model=MetricPage)
def read_metrics(
    job_id: str,
    session: SessionDep,
    user: CurrentUser,
    after: Annotated[str | None, Query(description="``next_cursor`` of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    attempts: Annotated[
        Attempts,
        Query(
            description="``effective``: per step only the newest attempt's point; ``all``: every attempt."
        ),
    ] = "effective",
    max_points: Annotated[
        int | None,
        Query(
            ge=1,
            le=10_000,
            description="Return the whole run in at most this many points (per bucket of "
            "steps: first, last, min and max loss; marked ``downsampled``). Not with ``after``.",
        ),
    ] = None,
    fields: Annotated[
        str | None, Query(description="Comma-separated metric fields to return (default all).")
    ] = None,
) -> MetricPage:
    """Recorded metric points after ``after`` in recording order; ``next_cursor`` passed back
    returns only newer points, so no point is ever repeated or skipped. With ``max_points``:
    the whole run downsampled in the database, ``next_cursor`` = the newest point's cursor."""
    visible_job(session, user, job_id)
    try:
        wanted = parse_fields(fields)
    except ValueError as exc:
        raise ValidationFailed(
            [{"field": "query.fields", "message": str(exc), "type": "value_error"}]
        ) from None
    if max_points is not None:
        if after is not None:
            raise ValidationFailed(
                [
                    {
                        "field": "query.after",
                        "message": "max_points covers the whole run: drop after",
                        "type": "value_error",
                    }
                ]
            )
        items, next_cursor = downsample(session, job_id, max_points, wanted)
        return MetricPage(items=items, next_cursor=next_cursor)
    try:
        cursor = None if after is None else Cursor.parse(after)
    except CursorError as exc:
        raise ValidationFailed(
            [{"field": "query.after", "message": str(exc), "type": "value_error"}]
        ) from None
    items, next_cursor = metric_page(session, job_id, after=cursor, limit=limit, attempts=attempts)
    return MetricPage(items=[select_fields(i, wanted) for i in items], next_cursor=next_cursor)


@router.get("/{job_id}/events", response_model=EventPage)
def read_events(
    job_id: str,
    session: SessionDep,
    user: CurrentUser,
    after: Annotated[int, Query(ge=0, description="``next_cursor`` of the previous page.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> EventPage:
    """Lifecycle events (queued, started, checkpoint, warning, resumed, succeeded, failed,
    cancelled) after ``after``, oldest first."""
    visible_job(session, user, job_id)
    items = [EventOut(**e) for e in event_page(session, job_id, after, limit)]
    return EventPage(items=items, next_cursor=str(items[-1].id if items else after))
