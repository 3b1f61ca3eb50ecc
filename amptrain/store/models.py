"""SQLAlchemy models: the SQL database is the truth about every job.

The schema itself comes only from the Alembic migrations in ``migrations/``;
these classes describe it for queries (and for ``alembic revision --autogenerate``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# Re-exported for the recorder and the watch; the statuses are defined in amptrain.core.enums.
from amptrain.core.enums import FINISHED_STATUSES as FINISHED_STATUSES
from amptrain.core.enums import JobStatus

# SQLite has no BIGINT autoincrement: only "INTEGER PRIMARY KEY" is the rowid alias.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive text)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTCDateTime column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_job_id() -> str:
    return "j_" + uuid.uuid4().hex


class Base(DeclarativeBase):
    metadata = sa.MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class Job(Base):
    """One submitted training job; status transitions are fenced by ``attempt``."""

    __tablename__ = "jobs"
    __table_args__ = (
        sa.UniqueConstraint("owner", "idempotency_key"),
        sa.Index(None, "created_at", "id"),
        sa.Index(None, "status"),
        sa.Index(None, "telemetry_done", "attempt"),
    )

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True, default=new_job_id)
    name: Mapped[str] = mapped_column(sa.String(200))
    owner: Mapped[str] = mapped_column(sa.String(200))
    status: Mapped[str] = mapped_column(sa.String(16), default=JobStatus.QUEUED.value)
    queue: Mapped[str] = mapped_column(sa.String(16))
    spec: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    step: Mapped[int] = mapped_column(default=0)
    max_steps: Mapped[int]
    attempt: Mapped[int] = mapped_column(default=0)
    max_attempts: Mapped[int] = mapped_column(default=3)
    # Epoch seconds from the DATABASE clock (db_now()), never a worker's clock.
    lease_expires_at: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    worker: Mapped[str | None] = mapped_column(sa.String(200))
    precision_requested: Mapped[str | None] = mapped_column(sa.String(8))
    precision_effective: Mapped[str | None] = mapped_column(sa.String(8))
    precision_reason: Mapped[str | None] = mapped_column(sa.Text)
    error_code: Mapped[str | None] = mapped_column(sa.String(32))
    error_message: Mapped[str | None] = mapped_column(sa.Text)
    error_step: Mapped[int | None]
    summary: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(200))
    request_hash: Mapped[str | None] = mapped_column(sa.String(64))
    dispatched_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    telemetry_done: Mapped[bool] = mapped_column(default=False)


class JobEvent(Base):
    """A lifecycle event; ``id`` is the events cursor. ``time`` is unix seconds."""

    __tablename__ = "job_events"
    __table_args__ = (
        # An event's cursor is its stream entry id, so a replay inserts nothing. NULL
        # (NULLs never collide): an event of an unclaimed job (cursor 0-{id}), or one the
        # API wrote that the recorder has not yet appended to the stream (see amptrain.store.events).
        sa.UniqueConstraint("job_id", "source_id"),
        sa.Index(None, "job_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int]
    type: Mapped[str] = mapped_column(sa.String(32))
    step: Mapped[int | None]
    time: Mapped[float] = mapped_column(sa.Float(precision=53))
    data: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
    source_id: Mapped[str | None] = mapped_column(sa.String(40))


class MetricPoint(Base):
    """One optimizer step of one attempt; columns named as
    amptrain.contract.records.STORED_METRIC_FIELDS."""

    __tablename__ = "metric_points"
    __table_args__ = (
        sa.UniqueConstraint("job_id", "attempt", "step"),
        sa.Index(None, "job_id", "stream_ms", "stream_seq"),
        sa.Index(None, "job_id", "step"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int]
    # The Redis stream entry id "ms-seq": the metrics cursor.
    stream_ms: Mapped[int] = mapped_column(sa.BigInteger)
    stream_seq: Mapped[int] = mapped_column(sa.BigInteger)
    step: Mapped[int]
    time: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    loss: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    loss_scale: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    skipped: Mapped[bool | None]
    grad_norm: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    lr: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    memory_allocated: Mapped[int | None] = mapped_column(sa.BigInteger)
    memory_reserved: Mapped[int | None] = mapped_column(sa.BigInteger)
    memory_peak: Mapped[int | None] = mapped_column(sa.BigInteger)
    samples_per_second: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    step_time_ms: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    skipped_steps: Mapped[int | None]
    # Data-parallel runs only (amptrain.contract.records.PARALLEL_METRIC_FIELDS); null
    # for one device. The memory_* columns above are then the maximum over ranks.
    world_size: Mapped[int | None]
    memory_peak_per_rank: Mapped[list[int] | None] = mapped_column(sa.JSON)


class ApiToken(Base):
    """A bearer token, stored as the sha256 hex of the plaintext."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(sa.String(200), unique=True)
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """After this the token is refused (401); null: never expires."""
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """Set by ``amptrain token revoke``; a revoked token is refused (401) from then on."""


class MetricSummary(Base):
    """The aggregates of a job's effective series (per step the newest attempt's point) over
    the aligned steps ``[idx * 2**level, (idx + 1) * 2**level)``: what a downsampled history
    read needs per bucket without visiting the points (see :mod:`amptrain.store.history.summaries`)."""

    __tablename__ = "metric_summaries"
    __table_args__ = (
        # Only the nodes holding flagged steps: a read keeping every flagged step finds
        # them without walking every node of the window.
        sa.Index(
            None,
            "job_id",
            "level",
            "idx",
            sqlite_where=sa.text("flagged > 0"),
            postgresql_where=sa.text("flagged > 0"),
        ),
    )

    job_id: Mapped[str] = mapped_column(
        sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    level: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    idx: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    points: Mapped[int]
    first_step: Mapped[int]
    last_step: Mapped[int]
    skipped: Mapped[int]
    non_finite: Mapped[int]
    flagged: Mapped[int]
    first_flag: Mapped[int | None]
    # Per field that can spike (amptrain.store.history.window.EXTREMA_FIELDS): the lowest and the
    # highest finite value and the first step holding each.
    loss_min: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    loss_min_step: Mapped[int | None]
    loss_max: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    loss_max_step: Mapped[int | None]
    grad_norm_min: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    grad_norm_min_step: Mapped[int | None]
    grad_norm_max: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    grad_norm_max_step: Mapped[int | None]
    loss_scale_min: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    loss_scale_min_step: Mapped[int | None]
    loss_scale_max: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    loss_scale_max_step: Mapped[int | None]
    samples_per_second_min: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    samples_per_second_min_step: Mapped[int | None]
    samples_per_second_max: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    samples_per_second_max_step: Mapped[int | None]
    step_time_ms_min: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    step_time_ms_min_step: Mapped[int | None]
    step_time_ms_max: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    step_time_ms_max_step: Mapped[int | None]
    memory_allocated_min: Mapped[int | None] = mapped_column(sa.BigInteger)
    memory_allocated_min_step: Mapped[int | None]
    memory_allocated_max: Mapped[int | None] = mapped_column(sa.BigInteger)
    memory_allocated_max_step: Mapped[int | None]


class MetricSummaryState(Base):
    """How far a job's summaries reach: the cursor of the newest point they hold (a read
    trusts them only when it is the job's newest cursor) and their top level."""

    __tablename__ = "metric_summary_state"

    job_id: Mapped[str] = mapped_column(
        sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    stream_ms: Mapped[int] = mapped_column(sa.BigInteger)
    stream_seq: Mapped[int] = mapped_column(sa.BigInteger)
    top: Mapped[int]
