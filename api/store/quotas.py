"""What one user holds: the count behind the per-user active-jobs limit.

Functions take a Session and never commit.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from api.core.enums import FINISHED_STATUSES
from api.store.models import Job


def lock_owner(s: Session, owner: str) -> None:
    """Serialize this owner's submissions until the transaction ends (PostgreSQL: an
    advisory lock, so two concurrent submissions cannot both pass the limit; SQLite
    serializes writers itself, and a rare race there overshoots by one)."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext("jobs:" + owner))))


def active_jobs(s: Session, owner: str) -> int:
    """The owner's jobs that are not finished (queued, running or cancelling)."""
    return int(
        s.scalar(
            sa.select(sa.func.count())
            .select_from(Job)
            .where(Job.owner == owner, Job.status.not_in([x.value for x in FINISHED_STATUSES]))
        )
        or 0
    )
