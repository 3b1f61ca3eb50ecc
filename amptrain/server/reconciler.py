"""The reconciler: the dispatcher leader's repair pass over jobs the broker cannot recover.

Celery on Redis only emulates acknowledgements, so recovery never relies on it.
Two cases, both decided by the SQL truth:

- **An expired lease** (worker killed, machine lost): the attempt is reaped by
  :func:`amptrain.store.jobs.reap_expired`, which requeues the job, or ends it
  ``failed`` when no attempt is left or ``cancelled`` when a cancel was pending.
- **A lost dispatch**: a job sent long ago that is neither claimed nor still
  waiting in its broker queue (a worker died between taking the message and
  claiming it) is marked undispatched, so the dispatcher's sweep sends it again.

A duplicate send is harmless: the worker's guarded claim runs a job once.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import timedelta

import redis
from sqlalchemy.orm import Session, sessionmaker

from amptrain.server import broker
from amptrain.store import jobs, outbox
from amptrain.store.models import utcnow

log = logging.getLogger(__name__)

BATCH = 200
LOST_DISPATCH_AFTER = timedelta(seconds=120)
"""A queued job dispatched this long ago and absent from its queue is sent again."""


def reap_expired_leases(sessions: sessionmaker[Session]) -> int:
    """Requeue (or end) attempts whose lease expired; returns how many were reaped."""
    with sessions() as s:
        expired = jobs.expired_jobs(s)
    reaped = 0
    for job_id, attempt in expired:
        with sessions.begin() as s:
            status = jobs.reap_expired(s, job_id, attempt)
        if status is None:  # renewed meanwhile: nothing was written
            continue
        reaped += 1
        log.warning("job %s attempt %d lost its worker: now %s", job_id, attempt, status)
    return reaped


def forget_lost_dispatches(
    sessions: sessionmaker[Session], client: redis.Redis, queues: Collection[str]
) -> int:
    """Mark old dispatched-but-unclaimed jobs that no broker queue holds as undispatched
    (the sweep then re-sends them); returns how many. Only the served ``queues`` are
    read: a job of any other queue counts as lost, and the sweep then rejects it."""
    cutoff = utcnow() - LOST_DISPATCH_AFTER
    with sessions() as s:
        rows = outbox.dispatched_before(s, cutoff, BATCH)
    if not rows:
        return 0
    waiting: set[str] = set()
    for queue in {q for _, q in rows} & set(queues):
        waiting |= broker.waiting_job_ids(client, queue)
    lost = [job_id for job_id, _ in rows if job_id not in waiting]
    if lost:
        with sessions.begin() as s:
            outbox.forget_dispatch(s, lost, cutoff)
        log.warning("re-dispatching %d job(s) whose message was lost: %s", len(lost), lost)
    return len(lost)
