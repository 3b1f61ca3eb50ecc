"""Rows written at an older revision of the schema, for the migration tests: only the
columns the revisions they start from already have (today's ORM writes every column)."""

from __future__ import annotations

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
