"""What one user holds: the count behind the per-user active-jobs limit.

Functions take a Session and never commit.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.core.enums import FINISHED_STATUSES
from amptrain.store.models import Job


def lock_owner(s: Session, owner: str) -> None:
    """Serialize this owner's submissions until the transaction ends, so two concurrent
    submissions cannot both count room under the limit. PostgreSQL: an advisory lock per
    owner. SQLite: its one write lock, taken now by a write that changes nothing (the
    count that follows then sees every committed submission; without it two deferred
    transactions both counted before either inserted)."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext("jobs:" + owner))))
    else:
        s.execute(sa.text("UPDATE jobs SET owner = owner WHERE 0"))


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
