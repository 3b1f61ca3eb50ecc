"""The job state machine's vocabulary, defined once for the API and the worker.

``StrEnum`` members are ``str``: they compare equal to the text stored in SQL
and sent over JSON, so the database and the wire keep their plain strings.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """Where a job is. ``queued`` → ``running`` (→ ``cancelling``) → one of the finished three."""

    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in FINISHED_STATUSES

    @property
    def active(self) -> bool:
        """Held by a worker under a lease."""
        return self in ACTIVE_STATUSES


ACTIVE_STATUSES: frozenset[JobStatus] = frozenset({JobStatus.RUNNING, JobStatus.CANCELLING})
FINISHED_STATUSES: frozenset[JobStatus] = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}
)


class TaskName(StrEnum):
    """Celery task names: the API sends by name and never imports the worker."""

    RUN_JOB = "amptrain.run_job"
    JOIN_JOB = "amptrain.join_job"
    """A multi-node job's other nodes: ``(job_id, attempt)``, sent by its first node."""
