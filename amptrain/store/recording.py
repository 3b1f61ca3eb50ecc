"""The recorder's SQL beside the chunks (:func:`amptrain.store.history.rollups.record`):
which jobs to record, idempotent inserts of events, job progress and the end of a job's
telemetry.

Each function runs inside the caller's transaction and commits nothing. A
replayed stream entry inserts nothing and so changes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.jsonsafe import finite
from amptrain.contract.metrics import SUMMARY_FIELDS
from amptrain.contract.records import OVERFLOW_WARNING
from amptrain.core.enums import FINISHED_STATUSES
from amptrain.store.db import dialect_insert
from amptrain.store.history.chunk_merge import Gained
from amptrain.store.history.chunk_parts import Key
from amptrain.store.history.throughput import steady_rates
from amptrain.store.models import Job, JobEvent


class Recordable(NamedTuple):
    """A job whose telemetry is not complete yet, as the recorder needs to know it."""

    id: str
    status: str
    attempt: int
    finished_at: datetime | None


def jobs_to_record(s: Session) -> list[Recordable]:
    """Jobs that have run (``attempt > 0``) and whose telemetry is not complete: SQL, not
    Redis, decides which streams matter, so the work survives Redis losing its data."""
    rows = s.execute(
        sa.select(Job.id, Job.status, Job.attempt, Job.finished_at).where(
            Job.telemetry_done == sa.false(), Job.attempt > 0
        )
    )
    return [Recordable(*r) for r in rows]


def insert_events(s: Session, rows: list[dict[str, Any]]) -> None:
    """Record stream events with their entry id (``source_id``) as cursor. An event the
    API wrote to SQL and the recorder appended to the stream carries its row ``id``: it
    gets its cursor instead of a second row. Replays change nothing."""
    new = _not_yet_recorded(s, [r for r in rows if r.get("id") is None])
    if new:
        stmt = dialect_insert(s, JobEvent).values(
            [{k: v for k, v in r.items() if k != "id"} for r in new]
        )
        s.execute(stmt.on_conflict_do_nothing(index_elements=["job_id", "source_id"]))
    for r in rows:
        if r.get("id") is not None:
            s.execute(
                sa.update(JobEvent)
                .where(
                    JobEvent.id == r["id"],
                    JobEvent.job_id == r["job_id"],
                    JobEvent.source_id.is_(None),
                )
                .values(source_id=r["source_id"])
                .execution_options(synchronize_session=False)
            )


def overflow_jobs(rows: list[dict[str, Any]]) -> set[str]:
    """The jobs among event rows about to be inserted that have a ``gradient_overflow``."""
    return {r["job_id"] for r in rows if _is_overflow(r["type"], r.get("data"))}


def refresh_overflow_counts(s: Session, job_ids: set[str]) -> None:
    """Recount each job's ``overflow_counts`` from its recorded ``gradient_overflow``
    warnings: one per step, the newest attempt's (a resumed attempt re-runs the steps after
    its checkpoint), counted by the parameter it names. Recomputed from SQL like
    ``eval_summary``, so a replayed or re-sent entry cannot count twice."""
    e = JobEvent
    for job_id in sorted(job_ids):
        per_step: dict[int, tuple[int, str]] = {}
        rows = s.execute(
            sa.select(e.step, e.attempt, e.data).where(e.job_id == job_id, e.type == "warning")
        )
        for step, attempt, data in rows:
            if step is None or not _is_overflow("warning", data) or not data.get("param"):
                continue
            if step not in per_step or attempt >= per_step[step][0]:
                per_step[step] = (attempt, data["param"])
        counts = Counter(param for _, param in per_step.values())
        s.execute(
            sa.update(Job)
            .where(Job.id == job_id)
            .values(overflow_counts=dict(counts.most_common()))
            .execution_options(synchronize_session=False)
        )


def _is_overflow(type_: str, data: Any) -> bool:
    return type_ == "warning" and isinstance(data, dict) and data.get("code") == OVERFLOW_WARNING


def _not_yet_recorded(s: Session, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop events re-sent after Redis lost data: a re-sent entry has a new entry id but
    the same (attempt, type, step, time) -- ``time`` is taken when the event is made."""
    if not rows:
        return []
    e = JobEvent
    seen = {
        (r.attempt, r.type, r.step, r.time)
        for r in s.execute(
            sa.select(e.attempt, e.type, e.step, e.time).where(
                e.job_id == rows[0]["job_id"], e.time.in_({r["time"] for r in rows})
            )
        )
    }
    fresh = []
    for r in rows:
        key = (r["attempt"], r["type"], r["step"], r["time"])
        if key not in seen:
            seen.add(key)
            fresh.append(r)
    return fresh


def update_progress(
    s: Session,
    newest: Mapping[str, Mapping[str, Any]],
    gains: Mapping[Key, Gained],
    last: Mapping[Key, int],
) -> None:
    """Per job (``job_id -> the newest point this batch's chunks gained for its newest
    attempt``): keep ``step`` and ``summary`` at it (a replay gains nothing, so it changes
    nothing); ``gains`` and ``last``: the batch's chunk write
    (:func:`~amptrain.store.history.throughput.steady_rates`). One executemany for every
    job of the batch."""
    rows = []
    rates = steady_rates(s, {job_id: p["attempt"] for job_id, p in newest.items()}, gains, last)
    for job_id, point in newest.items():
        summary = {f: finite(point.get(f)) for f in SUMMARY_FIELDS}
        summary["samples_per_second"] = rates[job_id]
        rows.append(
            {
                "b_id": job_id,
                "b_attempt": point["attempt"],
                "b_step": point["step"],
                "b_summary": summary,
            }
        )
    if not rows:
        return
    t: sa.Table = Job.__table__  # type: ignore[assignment]
    s.execute(
        sa.update(t)
        .where(t.c.id == sa.bindparam("b_id"), t.c.attempt == sa.bindparam("b_attempt"))
        .values(step=sa.bindparam("b_step"), summary=sa.bindparam("b_summary")),
        rows,
    )


def mark_done(s: Session, job_id: str, end_attempts: list[int]) -> bool:
    """The current attempt's ``end`` entry closes the stream once the job is finished in SQL
    (an earlier attempt's end, e.g. before a re-queue, does not)."""
    result = s.execute(
        sa.update(Job)
        .where(
            Job.id == job_id,
            Job.attempt.in_(end_attempts),
            Job.status.in_(FINISHED_STATUSES),
        )
        .values(telemetry_done=True)
        .returning(Job.id)
        .execution_options(synchronize_session=False)
    )
    return result.first() is not None


def mark_swept(s: Session, job_id: str) -> None:
    """A finished job whose ``end`` entry never came: its telemetry is complete as it is."""
    s.execute(
        sa.update(Job)
        .where(Job.id == job_id, Job.status.in_(FINISHED_STATUSES))
        .values(telemetry_done=True)
        .execution_options(synchronize_session=False)
    )
