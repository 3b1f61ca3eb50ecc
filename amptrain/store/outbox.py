"""The jobs table as the dispatcher's outbox: which queued jobs a broker still has to get.

``dispatched_at`` says a job's message was handed to the broker. Only the worker's
guarded claim decides who runs a job, so a job sent twice by these queries' callers
runs once. Functions take a Session and never commit: the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.core.enums import JobStatus
from amptrain.store.models import Job, utcnow


def undispatched(s: Session, created_before: datetime, limit: int) -> list[tuple[str, str, int]]:
    """``(job_id, queue, attempt)`` of queued jobs no broker got yet, in the order they were
    submitted. A job created after ``created_before`` is skipped on its first attempt: the
    process that created it is still sending it. A job given back until a later
    ``dispatch_after`` (a multi-node job waiting for nodes) is skipped until then."""
    rows = s.execute(
        sa.select(Job.id, Job.queue, Job.attempt)
        .where(
            Job.status == JobStatus.QUEUED,
            Job.dispatched_at.is_(None),
            sa.or_(Job.created_at < created_before, Job.attempt > 0),
            sa.or_(Job.dispatch_after.is_(None), Job.dispatch_after < utcnow()),
        )
        .order_by(Job.created_at)
        .limit(limit)
    )
    return [(r.id, r.queue, r.attempt) for r in rows]


def returned(s: Session, job_id: str) -> tuple[str, int] | None:
    """``(queue, attempt)`` of this job if it ran, came back to its queue and waits to be
    sent again now (not held back by ``dispatch_after``); else None."""
    row = s.execute(
        sa.select(Job.queue, Job.attempt).where(
            Job.id == job_id,
            Job.status == JobStatus.QUEUED,
            Job.dispatched_at.is_(None),
            Job.attempt > 0,
            sa.or_(Job.dispatch_after.is_(None), Job.dispatch_after < utcnow()),
        )
    ).first()
    return (row.queue, row.attempt) if row is not None else None


def mark_dispatched(s: Session, job_id: str) -> None:
    """The broker accepted this job's message."""
    s.execute(
        sa.update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED, Job.dispatched_at.is_(None))
        .values(dispatched_at=utcnow())
    )


def dispatched_before(s: Session, cutoff: datetime, limit: int) -> list[tuple[str, str]]:
    """``(job_id, queue)`` of jobs sent before ``cutoff`` and still not claimed."""
    rows = s.execute(
        sa.select(Job.id, Job.queue)
        .where(Job.status == JobStatus.QUEUED, Job.dispatched_at < cutoff)
        .limit(limit)
    )
    return [(r.id, r.queue) for r in rows]


def forget_dispatch(s: Session, job_ids: Collection[str], cutoff: datetime) -> None:
    """Their message was lost: mark them undispatched (unless claimed or re-sent since)."""
    s.execute(
        sa.update(Job)
        .where(Job.id.in_(job_ids), Job.status == JobStatus.QUEUED, Job.dispatched_at < cutoff)
        .values(dispatched_at=None)
    )
