"""Stops an alert rule asks for, and how a stopped attempt ends.

A rule's ``stop`` turns a running job ``cancelling`` like a user's cancel (the worker
checkpoints and stops at its next step boundary), recording *why* (``stop_reason``) and
*how it should end* (``stop_outcome``: null for ``cancelled``, ``succeeded`` for an early
stop). The worker's conclusion (:func:`finish_stopped`) ends the attempt in that status,
fenced by the attempt like every job write. Functions never commit.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.core.enums import ACTIVE_STATUSES, JobStatus
from amptrain.store.fence import fenced, jobs_t, returning_row, utc
from amptrain.store.jobs import insert_event
from amptrain.store.models import utcnow


def request_stop(
    s: Session,
    job_id: str,
    attempt: int,
    reason: dict[str, Any],
    event: str,
    step: int | None,
    succeed: bool = False,
) -> bool:
    """Ask the running ``attempt`` to stop for ``reason`` (and record ``event`` saying so).
    The first stop asked wins: a job already cancelling keeps its reason and outcome.
    False when the attempt is no longer the job's running one (nothing written). The
    caller sets the Redis cancel key after commit (the heartbeat sees it anyway)."""
    c = jobs_t.c
    stmt = (
        jobs_t.update()
        .where(*fenced(job_id, attempt), c.status == JobStatus.RUNNING)
        .values(
            status=JobStatus.CANCELLING,
            cancel_requested_at=sa.func.coalesce(c.cancel_requested_at, utc(utcnow())),
            stop_reason=reason,
            stop_outcome=JobStatus.SUCCEEDED.value if succeed else None,
        )
        .returning(c.id)
    )
    if returning_row(s, job_id, stmt) is None:
        return False
    insert_event(s, job_id, attempt, event, step, reason)
    return True


class Stopped(NamedTuple):
    status: JobStatus
    reason: dict[str, Any] | None


def finish_stopped(s: Session, job_id: str, attempt: int) -> Stopped | None:
    """End an attempt that stopped on request: ``cancelled``, or the outcome an alert's
    stop recorded (``succeeded`` for an early stop). None when fenced out."""
    c = jobs_t.c
    outcome = sa.func.coalesce(c.stop_outcome, JobStatus.CANCELLED.value)
    stmt = (
        jobs_t.update()
        .where(*fenced(job_id, attempt))
        .values(
            status=outcome,
            finished_at=utc(utcnow()),
            lease_expires_at=None,
            error_code=None,
            error_message=None,
            error_step=None,
        )
        .returning(c.status, c.stop_reason)
    )
    row = returning_row(s, job_id, stmt)
    if row is None:
        return None
    return Stopped(JobStatus(row.status), row.stop_reason)


__all__ = ["ACTIVE_STATUSES", "Stopped", "finish_stopped", "request_stop"]
