"""The fence of a job's row: how a running attempt's write is guarded by its number.

A worker's claim returns the job's attempt number, its fencing token. Every later write of
that attempt (:mod:`amptrain.store.jobs`, :mod:`amptrain.store.stops`) is one guarded
``UPDATE ... RETURNING`` whose WHERE is :func:`fenced`: it matches only while ``jobs.attempt``
still equals the token and the job is active, so a worker that lost its lease changes
nothing, and the caller learns so from the empty result (:func:`returning_row`).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.core.enums import ACTIVE_STATUSES
from amptrain.store.models import Job, UTCDateTime

jobs_t: sa.Table = Job.__table__  # type: ignore[assignment]


def fenced(job_id: str, attempt: int) -> tuple[sa.ColumnElement[bool], ...]:
    """The conditions of a write of ``attempt``: the job, still at that attempt, active."""
    c = jobs_t.c
    return (c.id == job_id, c.attempt == attempt, c.status.in_(ACTIVE_STATUSES))


def returning(s: Session, job_id: str, stmt: sa.Executable) -> Any:
    """The first column of :func:`returning_row`'s row, or None."""
    row = returning_row(s, job_id, stmt)
    return None if row is None else row[0]


def returning_row(s: Session, job_id: str, stmt: sa.Executable) -> sa.Row[Any] | None:
    """Run a guarded ``UPDATE ... RETURNING`` of the job's row: its row, or None when the
    guard did not match (the write is not this attempt's to make)."""
    s.flush()
    row = s.execute(stmt).one_or_none()
    # Core UPDATEs bypass the identity map: drop a stale copy of the job, if loaded.
    cached = s.identity_map.get(Session.identity_key(Job, job_id))
    if cached is not None:
        s.expire(cached)
    return row


def utc(value: Any) -> sa.BindParameter[Any]:
    """A datetime bound as the jobs table's UTC column type (SQLite keeps it as text)."""
    return sa.literal(value, UTCDateTime())
