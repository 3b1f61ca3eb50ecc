"""The recorder's SQL writes: idempotent inserts of points and events, job progress.

Each function runs inside the caller's transaction and commits nothing. A
replayed stream entry inserts nothing and so changes nothing.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from api.contracts.jsonsafe import finite
from api.store.models import FINISHED_STATUSES, Job, JobEvent, MetricPoint

SUMMARY_FIELDS = ("loss", "loss_scale", "skipped_steps", "memory_peak", "samples_per_second")
"""The newest point's fields a job's ``summary`` shows."""


def _insert(s: Session, model: type[Any]) -> Any:
    dialect = s.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(model)
    if dialect == "sqlite":
        return sqlite.insert(model)
    raise RuntimeError(f"unsupported database: {dialect}")


def insert_points(s: Session, rows: list[dict[str, Any]]) -> set[tuple[int, int]]:
    """Insert new points; returns (attempt, step) of those actually inserted."""
    if not rows:
        return set()
    stmt = (
        _insert(s, MetricPoint)
        .on_conflict_do_nothing(index_elements=["job_id", "attempt", "step"])
        .returning(MetricPoint.attempt, MetricPoint.step)
    )
    # Rows as executemany parameters, not .values(rows): the statement then compiles once
    # and is cached ("insertmanyvalues" batches it), about 10x faster per row.
    return {(r.attempt, r.step) for r in s.execute(stmt, rows)}


def insert_events(s: Session, rows: list[dict[str, Any]]) -> None:
    if rows:
        stmt = _insert(s, JobEvent).values(rows)
        s.execute(stmt.on_conflict_do_nothing(index_elements=["job_id", "source_id"]))


def update_progress(
    s: Session, job_id: str, points: list[dict[str, Any]], inserted: set[tuple[int, int]]
) -> None:
    """Keep ``step`` and ``summary`` at the newest point this batch actually added for the
    job's current attempt (a replay adds nothing, so it changes nothing)."""
    new = [p for p in points if (p["attempt"], p["step"]) in inserted]
    if not new:
        return
    latest_attempt = max(p["attempt"] for p in new)
    newest = [p for p in new if p["attempt"] == latest_attempt][-1]  # stream order
    summary = {f: finite(newest.get(f)) for f in SUMMARY_FIELDS}
    s.execute(
        sa.update(Job)
        .where(Job.id == job_id, Job.attempt == newest["attempt"])
        .values(step=newest["step"], summary=summary)
        .execution_options(synchronize_session=False)
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
