"""Reads of the jobs table for the API: the keyset-paged list, ownership, and counts.

Functions take a Session and never commit.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.records import PRECISION_FALLBACK
from amptrain.store.models import Job, JobEvent

PageKey = tuple[datetime, str]
"""``(created_at, id)`` of the last job on a page: the next page starts below it."""

FALLBACK_FIELDS = ("trigger", "trigger_step", "to", "resume_from", "param")
"""What ``precision_history`` keeps of a ``precision_fallback`` event's data (its message is
the entry's ``reason``)."""


def page_of_jobs(
    s: Session,
    *,
    owner: str | None,
    statuses: Collection[str] | None,
    after: PageKey | None,
    limit: int,
    id_prefix: str | None = None,
) -> tuple[list[Job], bool]:
    """Up to ``limit`` jobs, newest first, below ``after``; and whether more follow.
    ``owner`` None means everyone's jobs; ``statuses`` None means every status;
    ``id_prefix``: only the jobs whose id starts with it."""
    query = sa.select(Job)
    if id_prefix is not None:
        query = query.where(Job.id.startswith(id_prefix, autoescape=True))  # "_" is literal
    if owner is not None:
        query = query.where(Job.owner == owner)
    if statuses:
        query = query.where(Job.status.in_(statuses))
    if after is not None:
        created_at, job_id = after
        query = query.where(
            sa.or_(
                Job.created_at < created_at,
                sa.and_(Job.created_at == created_at, Job.id < job_id),
            )
        )
    rows = s.scalars(query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)).all()
    return list(rows[:limit]), len(rows) > limit


def owned_job_ids(s: Session, owner: str, job_ids: Collection[str]) -> set[str]:
    """Those of ``job_ids`` that belong to ``owner``."""
    if not job_ids:
        return set()
    return set(s.scalars(sa.select(Job.id).where(Job.id.in_(job_ids), Job.owner == owner)))


def job_names(s: Session, job_ids: Collection[str]) -> dict[str, str]:
    """The names of those of ``job_ids`` that exist, by id."""
    if not job_ids:
        return {}
    rows = s.execute(sa.select(Job.id, Job.name).where(Job.id.in_(job_ids)))
    return {job_id: name for job_id, name in rows}


def count_by_status(s: Session) -> dict[str, int]:
    """How many jobs are in each status (statuses without jobs are absent)."""
    rows = s.execute(sa.select(Job.status, sa.func.count()).group_by(Job.status))
    return {status: n for status, n in rows}


def first_claims_after(
    s: Session, after: PageKey, limit: int = 10_000
) -> Sequence[sa.Row[str, datetime, datetime | None]]:
    """``(id, created_at, started_at)`` of jobs first claimed after ``after`` =
    ``(started_at, id)``, in that order: a watermark that misses and repeats nothing."""
    at, last_id = after
    return s.execute(
        sa.select(Job.id, Job.created_at, Job.started_at)
        .where(
            Job.started_at.is_not(None),
            sa.or_(Job.started_at > at, sa.and_(Job.started_at == at, Job.id > last_id)),
        )
        .order_by(Job.started_at, Job.id)
        .limit(limit)
    ).all()


def precision_history(s: Session, job_id: str) -> list[dict[str, Any]]:
    """The job's precisions over its steps, from its events: ``{"from_step", "until_step",
    "precision", "attempt", "reason", "fallback"}`` per change, oldest first. An attempt
    trains in the precision its ``started`` event names from the step its ``resumed`` event
    names (0 without one); an attempt after a ``precision_fallback`` gives that event's
    message as its reason and its structured fields as ``fallback`` (``trigger``,
    ``trigger_step``, ``to``, ``resume_from``, ``param``), and the entry before it
    ends at the trigger step (``until_step``; null: it trained on until the next entry or
    the end). A resume in the same precision starts no new entry."""
    e = JobEvent
    rows = s.execute(
        sa.select(e.attempt, e.type, e.data)
        .where(e.job_id == job_id, e.type.in_(("started", "resumed", PRECISION_FALLBACK)))
        .order_by(e.id)
    )
    segments: dict[int, dict[str, Any]] = {}
    fell_back: dict[str, Any] | None = None
    for attempt, kind, data in rows:
        if kind == "started":
            chosen = data.get("precision") or {}
            segments[attempt] = {
                "from_step": 0,
                "until_step": None,
                "precision": chosen.get("effective"),
                "attempt": attempt,
                "reason": fell_back.get("message") if fell_back else chosen.get("reason"),
                "fallback": {k: fell_back.get(k) for k in FALLBACK_FIELDS} if fell_back else None,
            }
            fell_back = None
        elif kind == "resumed" and attempt in segments:
            segments[attempt]["from_step"] = int(data.get("from_step") or 0)
        elif kind == PRECISION_FALLBACK:
            fell_back = data
            if attempt in segments and isinstance(data.get("trigger_step"), int):
                segments[attempt]["until_step"] = data["trigger_step"]
    history: list[dict[str, Any]] = []
    for segment in segments.values():
        if not history or history[-1]["precision"] != segment["precision"]:
            history.append(segment)
        elif segment["until_step"] is not None:
            history[-1]["until_step"] = segment["until_step"]
    return history


def forks_of(s: Session, job_id: str, owner: str | None, limit: int) -> tuple[list[Job], bool]:
    """Up to ``limit`` forks of the job, newest first (``owner`` None: everyone's), and
    whether it has more."""
    query = sa.select(Job).where(Job.parent_id == job_id)
    if owner is not None:
        query = query.where(Job.owner == owner)
    rows = s.scalars(query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)).all()
    return list(rows[:limit]), len(rows) > limit


def nodes(s: Session, job_id: str) -> tuple[int, list[dict[str, Any]]] | None:
    """The machines of the newest attempt that started on several (``nodes`` > 1): that
    attempt and, per node, ``{"node", "worker", "address", "ranks": [{"rank", "pid"}]}`` as
    its ``started`` event recorded them; None for a job that never started on several."""
    e = JobEvent
    row = s.execute(
        sa.select(e.attempt, e.data)
        .where(e.job_id == job_id, e.type == "started")
        .order_by(e.id.desc())
        .limit(1)
    ).first()
    if row is None:
        return None
    found = ((row.data or {}).get("process") or {}).get("nodes")
    return (row.attempt, list(found)) if isinstance(found, list) else None
