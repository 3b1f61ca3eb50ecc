"""Reading a job's events: by cursor for watchers, by row id for ``GET /jobs/{id}/events``,
and the ones still waiting to be appended to the job's stream.

An event's cursor (see :mod:`amptrain.contract.stream` for the route each event takes)
is its stream entry id (``source_id``); an event of a job no worker ever claimed
(attempt 0) has ``0-{id}``, before every stream entry; an event the API wrote about
a claimed job has none until the recorder appended it to the stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.cursor import Cursor
from amptrain.store.models import JobEvent


def event_cursor(row: JobEvent) -> Cursor | None:
    """The event's one cursor, or None while it waits for its stream entry."""
    if row.source_id is not None:
        return Cursor.of_entry(row.source_id)
    return Cursor(0, row.id) if row.attempt == 0 else None


def event_dict(row: JobEvent) -> dict[str, Any]:
    """An event as the API shows it (``id`` is the ``GET /jobs/{id}/events`` cursor)."""
    return {
        "id": row.id,
        "attempt": row.attempt,
        "type": row.type,
        "step": row.step,
        "time": row.time,
        "data": row.data or {},
    }


def events_after(s: Session, job_id: str, after: Cursor) -> list[tuple[Cursor, dict[str, Any]]]:
    """The job's events with a cursor beyond ``after``, in cursor order."""
    rows = s.scalars(sa.select(JobEvent).where(JobEvent.job_id == job_id)).all()
    placed = [(c, event_dict(r)) for r in rows if (c := event_cursor(r)) is not None and c > after]
    return sorted(placed, key=lambda pair: pair[0])


def event_page(s: Session, job_id: str, after_id: int, limit: int) -> list[dict[str, Any]]:
    """Events with a row id above ``after_id``, oldest first (``GET /jobs/{id}/events``)."""
    rows = s.scalars(
        sa.select(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.id > after_id)
        .order_by(JobEvent.id)
        .limit(limit)
    ).all()
    return [event_dict(r) for r in rows]


def unstreamed(s: Session, job_ids: Iterable[str]) -> list[dict[str, Any]]:
    """Events the API wrote about claimed jobs that no stream entry carries yet, oldest
    first, each with ``job_id`` (for the recorder to append to the job's stream)."""
    ids = list(job_ids)
    if not ids:
        return []
    e = JobEvent
    rows = s.scalars(
        sa.select(e).where(e.job_id.in_(ids), e.source_id.is_(None), e.attempt > 0).order_by(e.id)
    ).all()
    return [{**event_dict(r), "job_id": r.job_id} for r in rows]
