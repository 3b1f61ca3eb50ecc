"""Rows written at an older revision of the schema, for the migration tests: only the
columns the revisions they start from already have (today's ORM writes every column)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.job_ids import new_job_id
from amptrain.contract.spec import JobSpec
from amptrain.store.jobs import insert_event, jobs_t


def create_old_job(s: Session, spec: JobSpec, owner: str, queue: str) -> str:
    """A queued job and its ``queued`` event, as :func:`amptrain.store.jobs.create_job`
    writes them, in the columns of revision 0003; its id."""
    job_id = new_job_id()
    s.execute(
        sa.insert(jobs_t).values(
            id=job_id,
            name=spec.name,
            owner=owner,
            queue=queue,
            spec=spec.model_dump(mode="json"),
            max_steps=spec.max_steps,
            max_attempts=spec.max_attempts,
            precision_requested=spec.precision,
            summary={},
        )
    )
    insert_event(s, job_id, 0, "queued", None, {"queue": queue})
    return job_id


@contextmanager
def open_key(engine: sa.Engine) -> Iterator[None]:
    """While today's chunk writes run at a revision before 0021 (recording the run a
    migration test starts from): ``metric_chunks`` gets 0021's ``open`` key column for the
    time, then loses it again, so that the tables are the revision's, with its rows (as
    :class:`~amptrain.store.chunk_models.MetricExemplar`'s table is created for 0016's)."""
    pg = engine.dialect.name == "postgresql"
    with engine.begin() as conn:
        conn.execute(
            sa.text("ALTER TABLE metric_chunks ADD COLUMN open BOOLEAN NOT NULL DEFAULT false")
        )
        if pg:  # the conflict target of the upsert (SQLite's REPLACE needs none)
            _key(conn, "job_id, kind, name, chunk, attempt, open")
    yield
    with engine.begin() as conn:
        if pg:
            _key(conn, "job_id, kind, name, chunk, attempt")
        conn.execute(sa.text("ALTER TABLE metric_chunks DROP COLUMN open"))


def _key(conn: sa.Connection, columns: str) -> None:
    conn.execute(sa.text("ALTER TABLE metric_chunks DROP CONSTRAINT pk_metric_chunks"))
    conn.execute(
        sa.text(
            f"ALTER TABLE metric_chunks ADD CONSTRAINT pk_metric_chunks PRIMARY KEY ({columns})"
        )
    )
