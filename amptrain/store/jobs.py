"""The fenced job repository: every write of a running attempt is guarded by its number.

A worker :func:`claim`\\s a job with one guarded ``UPDATE ... RETURNING attempt``;
that attempt number is its fencing token. Each later write (heartbeat, event,
precision, final status) only matches while ``jobs.attempt`` still equals the
token and the job is active, so a worker that lost its lease changes nothing.
Leases are epoch seconds of the *database* clock (:class:`~amptrain.store.db.db_now`).

Functions take a Session and never commit: the caller owns the transaction.
The guarded UPDATE comes first in each function so PostgreSQL holds the job's
row lock (and SQLite its write lock) until the caller commits.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.spec import JobSpec
from amptrain.core.enums import ACTIVE_STATUSES, FINISHED_STATUSES, JobStatus
from amptrain.store.db import db_now
from amptrain.store.fence import fenced, jobs_t, returning, returning_row, utc
from amptrain.store.models import Job, JobEvent, utcnow

events_t: sa.Table = JobEvent.__table__  # type: ignore[assignment]


class JobNotFound(LookupError):
    """No job with that id."""


class JobFinished(Exception):
    """The job already ended; it cannot be cancelled (HTTP 409)."""

    def __init__(self, job_id: str, status: str) -> None:
        super().__init__(f"job {job_id} already {status}")
        self.job_id = job_id
        self.status = status


def create_job(
    s: Session,
    spec: JobSpec,
    owner: str,
    queue: str,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
    fork_of: tuple[str, int] | None = None,
) -> Job:
    """Add a queued job and its ``queued`` event. A concurrent duplicate
    ``(owner, idempotency_key)`` raises IntegrityError at flush: roll back and use
    :func:`find_by_idempotency_key`. ``fork_of``: ``(parent id, step)`` of a fork."""
    job = Job(
        name=spec.name,
        owner=owner,
        status=JobStatus.QUEUED,
        queue=queue,
        spec=spec.model_dump(mode="json"),
        max_steps=spec.max_steps,
        max_attempts=spec.max_attempts,
        precision_requested=spec.precision,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        summary={},
        parent_id=fork_of[0] if fork_of else None,
        fork_step=fork_of[1] if fork_of else None,
    )
    s.add(job)
    s.flush()
    data: dict[str, Any] = {"queue": queue}
    if fork_of is not None:
        data["forked_from"] = {"job": fork_of[0], "step": fork_of[1]}
    insert_event(s, job.id, 0, "queued", None, data)
    return job


def find_by_idempotency_key(s: Session, owner: str, key: str) -> Job | None:
    """The job this owner created earlier with this ``Idempotency-Key``, if any."""
    return s.scalars(
        sa.select(Job).where(Job.owner == owner, Job.idempotency_key == key)
    ).one_or_none()


def get_job(s: Session, job_id: str) -> Job | None:
    return s.get(Job, job_id)


def queued_queues(s: Session) -> list[str]:
    """The queues queued jobs wait on now, each once."""
    c = jobs_t.c
    return list(s.scalars(sa.select(c.queue).where(c.status == JobStatus.QUEUED).distinct()))


def claim(s: Session, job_id: str, worker: str, lease_s: float) -> int | None:
    """Take the job: queued, or active with an expired lease (and attempts left), becomes
    running (a pending cancel stays ``cancelling``) with ``attempt + 1``. Returns the new
    attempt, or None when someone else holds it or it is finished (duplicate delivery)."""
    c = jobs_t.c
    now = db_now()
    claimable = sa.or_(
        c.status == JobStatus.QUEUED,
        sa.and_(
            c.status.in_(ACTIVE_STATUSES),
            c.lease_expires_at < now,
            _attempts_left(),
        ),
    )
    stmt = (
        jobs_t.update()
        .where(c.id == job_id, claimable)
        .values(
            status=sa.case(
                (c.status == JobStatus.CANCELLING, JobStatus.CANCELLING), else_=JobStatus.RUNNING
            ),
            attempt=c.attempt + 1,
            lease_expires_at=now + lease_s,
            worker=worker,
            started_at=sa.func.coalesce(c.started_at, utc(utcnow())),
        )
        .returning(c.attempt)
    )
    return returning(s, job_id, stmt)


def heartbeat(s: Session, job_id: str, attempt: int, lease_s: float) -> str | None:
    """Renew the lease. Returns ``running`` or ``cancelling`` (stop at the next step
    boundary), or None when this attempt was fenced out: the caller must stop at once."""
    c = jobs_t.c
    stmt = (
        jobs_t.update()
        .where(*fenced(job_id, attempt))
        .values(lease_expires_at=db_now() + lease_s)
        .returning(c.status)
    )
    return returning(s, job_id, stmt)


def set_precision(
    s: Session, job_id: str, attempt: int, requested: str, effective: str, reason: str | None
) -> bool:
    """Record the precision this attempt actually trains with, and why."""
    stmt = (
        jobs_t.update()
        .where(*fenced(job_id, attempt))
        .values(
            precision_requested=requested, precision_effective=effective, precision_reason=reason
        )
        .returning(jobs_t.c.id)
    )
    return returning(s, job_id, stmt) is not None


def finish(
    s: Session, job_id: str, attempt: int, status: str, error: dict[str, Any] | None = None
) -> bool:
    """End the job as ``succeeded``/``failed``/``cancelled``; error is ``{code, message, step}``."""
    if status not in FINISHED_STATUSES:
        raise ValueError(f"not a final status: {status}")
    err = error or {}
    stmt = (
        jobs_t.update()
        .where(*fenced(job_id, attempt))
        .values(
            status=status,
            finished_at=utcnow(),
            lease_expires_at=None,
            error_code=err.get("code"),
            error_message=err.get("message"),
            error_step=err.get("step"),
        )
        .returning(jobs_t.c.id)
    )
    return returning(s, job_id, stmt) is not None


def release(
    s: Session,
    job_id: str,
    attempt: int,
    fallback_to: str | None = None,
    unplaced_wait_s: float | None = None,
) -> bool:
    """Give the job back (graceful shutdown, retry): running -> queued and undispatched,
    so the dispatcher sends it again. A job being cancelled ends ``cancelled`` instead.
    ``fallback_to``: a precision fallback; later attempts train in that precision, and the
    retry budget grows by one (a fallback is no failed attempt). ``unplaced_wait_s``: a
    multi-node attempt that could not reserve its nodes; the budget grows by one (nothing
    was tried) and the job is not dispatched again for that many seconds."""
    c = jobs_t.c
    cancelling = c.status == JobStatus.CANCELLING
    fallback: dict[str, Any] = {}
    if fallback_to is not None:
        fallback = {"precision_override": fallback_to, "fallbacks": c.fallbacks + 1}
    if unplaced_wait_s is not None:
        after = utcnow() + timedelta(seconds=unplaced_wait_s)
        fallback |= {"unplaced": c.unplaced + 1, "dispatch_after": utc(after)}
    stmt = (
        jobs_t.update()
        .where(*fenced(job_id, attempt))
        .values(
            status=sa.case((cancelling, JobStatus.CANCELLED), else_=JobStatus.QUEUED),
            finished_at=sa.case((cancelling, utc(utcnow())), else_=None),
            error_code=sa.case((cancelling, "cancelled"), else_=c.error_code),
            lease_expires_at=None,
            worker=None,
            dispatched_at=None,
            **fallback,
        )
        .returning(c.id)
    )
    return returning(s, job_id, stmt) is not None


def request_cancel(s: Session, job_id: str) -> JobStatus:
    """Ask the job to stop; returns its new status. Queued jobs end ``cancelled`` at once
    (with a ``cancelled`` event); running ones become ``cancelling`` (the caller then sets
    the Redis cancel key after commit). Raises JobFinished / JobNotFound."""
    c = jobs_t.c
    now = utc(utcnow())
    queued = (
        jobs_t.update()
        .where(c.id == job_id, c.status == JobStatus.QUEUED)
        .values(
            status=JobStatus.CANCELLED,
            finished_at=now,
            cancel_requested_at=now,
            error_code="cancelled",
        )
        .returning(c.attempt)
    )
    attempt = returning(s, job_id, queued)
    if attempt is not None:
        insert_event(s, job_id, attempt, "cancelled", None, {"reason": "cancelled while queued"})
        return JobStatus.CANCELLED
    active = (
        jobs_t.update()
        .where(c.id == job_id, c.status.in_(ACTIVE_STATUSES))
        .values(
            status=JobStatus.CANCELLING,
            cancel_requested_at=sa.func.coalesce(c.cancel_requested_at, now),
        )
        .returning(c.status)
    )
    if returning(s, job_id, active) is not None:
        return JobStatus.CANCELLING
    status = s.scalar(sa.select(c.status).where(c.id == job_id))
    if status is None:
        raise JobNotFound(job_id)
    raise JobFinished(job_id, status)


def reject_queued(s: Session, job_id: str, code: str, message: str) -> bool:
    """End a queued job ``failed`` before any worker saw it (e.g. its queue is not served)."""
    c = jobs_t.c
    stmt = (
        jobs_t.update()
        .where(c.id == job_id, c.status == JobStatus.QUEUED)
        .values(
            status=JobStatus.FAILED,
            finished_at=utc(utcnow()),
            error_code=code,
            error_message=message,
        )
        .returning(c.attempt)
    )
    attempt = returning(s, job_id, stmt)
    if attempt is None:
        return False
    insert_event(s, job_id, attempt, "failed", None, {"code": code, "message": message})
    return True


def expired_jobs(s: Session, limit: int = 100) -> list[tuple[str, int]]:
    """``(job_id, attempt)`` of active jobs whose lease ran out (for the reconciler)."""
    c = jobs_t.c
    rows = s.execute(
        sa.select(c.id, c.attempt)
        .where(c.status.in_(ACTIVE_STATUSES), c.lease_expires_at < db_now())
        .limit(limit)
    )
    return [(r.id, r.attempt) for r in rows]


WORKER_LOST = {"code": "worker_lost", "message": "the worker stopped renewing its lease"}


def reap_expired(
    s: Session, job_id: str, attempt: int, error: dict[str, Any] | None = None
) -> JobStatus | None:
    """Reconciler: if this attempt's lease expired, requeue the job when attempts remain
    (``queued``), end it ``cancelled`` when a cancel was pending, else ``failed`` with
    ``error`` (default :data:`WORKER_LOST`), and record the event that says which.
    Returns the new status, or None (nothing written) if the lease is still live."""
    c = jobs_t.c
    err = error or WORKER_LOST
    cancelling = c.status == JobStatus.CANCELLING
    exhausted = ~_attempts_left()
    final = sa.or_(cancelling, exhausted)
    stmt = (
        jobs_t.update()
        .where(*fenced(job_id, attempt), c.lease_expires_at < db_now())
        .values(
            status=sa.case(
                (cancelling, JobStatus.CANCELLED),
                (exhausted, JobStatus.FAILED),
                else_=JobStatus.QUEUED,
            ),
            finished_at=sa.case((final, utc(utcnow())), else_=None),
            error_code=sa.case((cancelling, "cancelled"), (exhausted, err.get("code")), else_=None),
            error_message=sa.case((exhausted, err.get("message")), else_=None),
            lease_expires_at=None,
            worker=None,
            dispatched_at=None,
        )
        .returning(c.status, c.step)
    )
    row = returning_row(s, job_id, stmt)
    if row is None:
        return None
    status = JobStatus(row.status)
    event, data = _reap_event(status, err)
    insert_event(s, job_id, attempt, event, row.step, data)
    return status


# -- internals ---------------------------------------------------------------


def _reap_event(status: JobStatus, err: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The event explaining what reaping did; the CASE in reap_expired made the decision."""
    if status == JobStatus.CANCELLED:
        return "cancelled", {"reason": "cancel requested; the worker was lost"}
    if status == JobStatus.FAILED:
        return "failed", dict(err)
    return "warning", {**err, "message": f"{err['message']}; the job goes back to the queue"}


def _attempts_left() -> sa.ColumnElement[bool]:
    """The retry budget: ``max_attempts``, plus one attempt per precision fallback and per
    multi-node attempt that could not reserve its nodes."""
    c = jobs_t.c
    return c.attempt < c.max_attempts + c.fallbacks + c.unplaced


def insert_event(
    s: Session,
    job_id: str,
    attempt: int,
    type: str,
    step: int | None,
    data: dict[str, Any] | None,
    time: float | None = None,
) -> None:
    """A lifecycle event the store writes itself (no stream entry: ``source_id`` null), at
    ``time`` or the database's now. Not fenced itself: write it after the guarded UPDATE
    that made it this attempt's to say. Commits nothing."""
    s.execute(
        events_t.insert().values(
            job_id=job_id,
            attempt=attempt,
            type=type,
            step=step,
            time=db_now() if time is None else time,
            data=data or {},
            source_id=None,
        )
    )
