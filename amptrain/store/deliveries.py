"""Firings and their webhook deliveries: the database as the alerts' outbox.

The recorder :func:`fire`\\s in its batch transaction, so a firing is stored with the
data that caused it; a replay inserts nothing (unique per rule, job, attempt, key) and
so queues no second delivery. A sender :func:`claim`\\s due rows with one guarded UPDATE
(a token and a lease on the database clock): of several API replicas, one sends a given
delivery, and a sender that died leaves its rows to the next once the lease ran out.
Each outcome is written fenced by that token (:func:`record_attempt`).

Functions take a Session and never commit: the caller owns the transaction.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.store.db import db_now, dialect_insert
from amptrain.store.models import AlertDelivery, AlertFiring, AlertRule, Job

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


def fire(
    s: Session,
    rule_id: int,
    job_id: str,
    attempt: int,
    key: str,
    step: int | None,
    data: dict[str, Any],
    notify: dict[str, Any] | None,
) -> int | None:
    """Store a firing, and its delivery when the rule notifies. Returns the firing's id,
    or None when it was stored before (a replay: nothing more to do)."""
    stmt = dialect_insert(s, AlertFiring).values(
        rule_id=rule_id, job_id=job_id, attempt=attempt, key=key[:80], step=step, data=data
    )
    stmt = stmt.on_conflict_do_nothing(index_elements=["rule_id", "job_id", "attempt", "key"])
    firing_id = s.execute(stmt.returning(AlertFiring.id)).scalar_one_or_none()
    if firing_id is None:
        return None
    if notify is not None:
        s.execute(
            sa.insert(AlertDelivery).values(
                firing_id=firing_id,
                rule_id=rule_id,
                url=notify["url"],
                format=notify.get("format", "json"),
                status=PENDING,
                attempts=0,
                max_retries=int(notify.get("max_retries", 0)),
                next_at=db_now(),
                history=[],
            )
        )
    return int(firing_id)


@dataclass(frozen=True)
class Due:
    """A claimed delivery with everything its request needs."""

    id: int
    claim: str
    url: str
    format: str
    attempts: int
    max_retries: int
    secret: str
    firing_id: int
    rule_id: int
    rule_name: str
    job_id: str
    job_name: str
    attempt: int
    step: int | None
    data: dict[str, Any]
    fired_at: float


def claim(s: Session, limit: int, lease_s: float) -> list[Due]:
    """Take up to ``limit`` due deliveries for ``lease_s`` seconds (database clock)."""
    d = AlertDelivery
    now = db_now()
    due = (
        sa.select(d.id)
        .where(
            d.status == PENDING,
            d.next_at <= now,
            sa.or_(d.claimed_until.is_(None), d.claimed_until < now),
        )
        .order_by(d.next_at)
        .limit(limit)
        .with_for_update(skip_locked=True)  # PostgreSQL: replicas skip each other's rows
    )
    token = secrets.token_hex(8)
    taken = s.execute(
        sa.update(d)
        .where(d.id.in_(due.scalar_subquery()), d.status == PENDING)
        .where(sa.or_(d.claimed_until.is_(None), d.claimed_until < now))
        .values(claim=token, claimed_until=now + lease_s)
        .returning(d.id)
        .execution_options(synchronize_session=False)
    )
    ids = [row[0] for row in taken]
    if not ids:
        return []
    f, r = AlertFiring, AlertRule
    rows = s.execute(
        sa.select(d, f, r.name, r.secret, Job.name.label("job_name"))
        .join(f, f.id == d.firing_id)
        .join(r, r.id == d.rule_id)
        .join(Job, Job.id == f.job_id)
        .where(d.id.in_(ids))
        .order_by(d.id)
    )
    return [
        Due(
            id=row.AlertDelivery.id,
            claim=token,
            url=row.AlertDelivery.url,
            format=row.AlertDelivery.format,
            attempts=row.AlertDelivery.attempts,
            max_retries=row.AlertDelivery.max_retries,
            secret=row.secret,
            firing_id=row.AlertFiring.id,
            rule_id=row.AlertDelivery.rule_id,
            rule_name=row.name,
            job_id=row.AlertFiring.job_id,
            job_name=row.job_name,
            attempt=row.AlertFiring.attempt,
            step=row.AlertFiring.step,
            data=row.AlertFiring.data or {},
            fired_at=row.AlertFiring.created_at.timestamp(),
        )
        for row in rows
    ]


def record_attempt(
    s: Session,
    due: Due,
    outcome: dict[str, Any],
    delivered: bool,
    retry_in_s: float,
    give_up: bool = False,
) -> bool:
    """Record one attempt's outcome (``{"at", "status_code", "error"}``), fenced by the
    claim: delivered, failed (retries spent), or pending again in ``retry_in_s`` seconds.
    False when the claim was lost (another sender took the row after our lease ran out)."""
    d = AlertDelivery
    attempts = due.attempts + 1
    row = s.execute(sa.select(d.history).where(d.id == due.id, d.claim == due.claim)).first()
    if row is None:
        return False
    if delivered:
        status = DELIVERED
    elif give_up or attempts > due.max_retries:
        status = FAILED
    else:
        status = PENDING
    done = s.execute(
        sa.update(d)
        .where(d.id == due.id, d.claim == due.claim, d.status == PENDING)
        .values(
            status=status,
            attempts=attempts,
            history=[*(row.history or []), outcome],
            next_at=db_now() + retry_in_s,
            claim=None,
            claimed_until=None,
        )
        .returning(d.id)
        .execution_options(synchronize_session=False)
    )
    return done.first() is not None


def deliveries_of(s: Session, rule_id: int, after_id: int, limit: int) -> list[dict[str, Any]]:
    """A rule's deliveries, newest first below ``after_id`` (0: from the newest)."""
    d, f = AlertDelivery, AlertFiring
    query = (
        sa.select(d, f.job_id, f.attempt, f.step, f.key)
        .join(f, f.id == d.firing_id)
        .where(d.rule_id == rule_id)
    )
    if after_id:
        query = query.where(d.id < after_id)
    rows = s.execute(query.order_by(d.id.desc()).limit(limit))
    return [
        {
            "id": row.AlertDelivery.id,
            "firing_id": row.AlertDelivery.firing_id,
            "job_id": row.job_id,
            "attempt": row.attempt,
            "step": row.step,
            "key": row.key,
            "url": row.AlertDelivery.url,
            "status": row.AlertDelivery.status,
            "attempts": row.AlertDelivery.attempts,
            "max_retries": row.AlertDelivery.max_retries,
            "history": row.AlertDelivery.history or [],
            "created_at": row.AlertDelivery.created_at,
        }
        for row in rows
    ]


def firings_of(s: Session, rule_id: int, limit: int) -> list[AlertFiring]:
    f = AlertFiring
    return list(s.scalars(sa.select(f).where(f.rule_id == rule_id).order_by(f.id).limit(limit)))
