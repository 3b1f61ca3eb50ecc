"""The ``waiting_for_queue`` event: a queued job whose queue no live worker serves says so.

The dispatcher asks after each send (see :mod:`amptrain.server.dispatcher`); this module
makes sure the job says it once per attempt it waits for, however many sends or API
processes ask. The job is not held back: its message waits in the broker's queue and
the first worker that consumes that queue runs it.
"""

from __future__ import annotations

from collections.abc import Collection

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.core.enums import JobStatus
from amptrain.store import jobs
from amptrain.store.models import Job, JobEvent

WAITING_FOR_QUEUE = "waiting_for_queue"

jobs_t: sa.Table = Job.__table__  # type: ignore[assignment]
events_t: sa.Table = JobEvent.__table__  # type: ignore[assignment]


def note_waiting(s: Session, job_id: str, queue: str, served: Collection[str]) -> bool:
    """Record that the queued job ``job_id`` waits for a worker of ``queue`` (``served``:
    the queues live workers take now), unless this attempt already said so. Returns
    whether it wrote the event. Commits nothing."""
    c = jobs_t.c
    # A no-op guarded UPDATE first: it takes the job's row lock (PostgreSQL) or the write
    # lock (SQLite), so two API processes asking at once write the event once.
    attempt = s.execute(
        jobs_t.update()
        .where(c.id == job_id, c.status == JobStatus.QUEUED)
        .values(status=c.status)
        .returning(c.attempt)
    ).scalar_one_or_none()
    if attempt is None:
        return False  # claimed, cancelled or gone meanwhile: nothing to say
    e = events_t.c
    said = s.scalar(
        sa.select(sa.func.count())
        .select_from(events_t)
        .where(e.job_id == job_id, e.attempt == attempt, e.type == WAITING_FOR_QUEUE)
    )
    if said:
        return False
    data = {
        "queue": queue,
        "message": f"no live worker takes jobs from queue {queue!r}; the job waits until one does",
        "served_queues": sorted(served),
    }
    jobs.insert_event(s, job_id, attempt, WAITING_FOR_QUEUE, None, data)
    return True
