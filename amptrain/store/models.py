"""SQLAlchemy models: the SQL database is the truth about every job.

The schema itself comes only from the Alembic migrations in ``amptrain/migrations/``;
these classes describe it for queries (and for ``alembic revision --autogenerate``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from amptrain.contract.job_ids import new_job_id

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
    fallbacks: Mapped[int] = mapped_column(server_default="0")
    """Precision fallbacks so far (``health.fallback``): each one adds an attempt to the
    retry budget, ``max_attempts + fallbacks``, since a fallback is no failed attempt."""
    unplaced: Mapped[int] = mapped_column(server_default="0")
    """Attempts of a multi-node job given back because the other nodes could not be
    reserved in time: each adds one to the retry budget (no training was tried)."""
    dispatch_after: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """Not dispatched again before this (a multi-node job that waits for nodes)."""
    precision_override: Mapped[str | None] = mapped_column(sa.String(8))
    """After a fallback: the precision every later attempt trains in instead of the spec's."""
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
    eval_summary: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    """The newest evaluation, ``{"step", "attempt", "values"}`` (shown as ``summary.eval``):
    its own column so the recorder's per-batch ``summary`` update never overwrites it."""
    parent_id: Mapped[str | None] = mapped_column(sa.String(40), index=True)
    """A fork's parent: the job whose checkpoint at ``fork_step`` is its first state (null
    for a job that started afresh; :mod:`amptrain.contract.forks`)."""
    fork_step: Mapped[int | None]
    """A fork's first state: the parent's checkpoint of this step; its own steps follow it."""
    overflow_counts: Mapped[dict[str, int] | None] = mapped_column(sa.JSON)
    """Per parameter (module path), the skipped fp16 steps it overflowed first in, most
    first (shown as ``summary.overflow_counts``); counted from the job's
    ``gradient_overflow`` warnings by :func:`amptrain.store.recording.refresh_overflow_counts`."""
    stop_reason: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    """Why a cancel was requested by an alert rule (``{"rule", "name", "event", ...}``);
    null: a user's cancel. The concluding event carries it as ``stopped_by``."""
    stop_outcome: Mapped[str | None] = mapped_column(sa.String(16))
    """The status a requested stop ends in: null (``cancelled``), or ``succeeded`` for an
    early stop (see :func:`amptrain.store.jobs.finish`)."""


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


class AlertRule(Base):
    """A user's alert rule (:class:`amptrain.contract.alerts.RuleSpec` as ``spec``). Only
    its owner's jobs are ever matched. ``job_id``: a rule of that one job (its spec's
    ``alerts``, or ``scope.job_id``); ``secret`` signs its webhooks."""

    __tablename__ = "alert_rules"
    __table_args__ = (sa.Index(None, "owner", "id"), sa.Index(None, "job_id"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(sa.String(200))
    name: Mapped[str] = mapped_column(sa.String(100))
    kind: Mapped[str] = mapped_column(sa.String(16))
    job_id: Mapped[str | None] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    spec: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    secret: Mapped[str] = mapped_column(sa.String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AlertFiring(Base):
    """A rule matched: stored in the recorder's transaction with the data that caused it.
    Unique per (rule, job, attempt, key): a replayed batch fires nothing twice. ``key``
    names what fired (``step:120``, ``event:<entry id>``, ``stall:<step>``)."""

    __tablename__ = "alert_firings"
    __table_args__ = (sa.UniqueConstraint("rule_id", "job_id", "attempt", "key"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    rule_id: Mapped[int] = mapped_column(sa.ForeignKey("alert_rules.id", ondelete="CASCADE"))
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int]
    key: Mapped[str] = mapped_column(sa.String(80))
    step: Mapped[int | None]
    data: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AlertDelivery(Base):
    """One webhook to send for a firing: the database is the outbox. ``status``
    ``pending`` until ``delivered`` or ``failed`` (retries spent); a sender holds a row
    while ``claim`` is its token and ``claimed_until`` (database clock) is ahead.
    ``history``: one ``{"at", "status_code", "error"}`` per attempt (at most
    ``max_retries + 1``)."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (sa.Index(None, "status", "next_at"), sa.Index(None, "rule_id", "id"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    firing_id: Mapped[int] = mapped_column(sa.ForeignKey("alert_firings.id", ondelete="CASCADE"))
    rule_id: Mapped[int] = mapped_column(sa.ForeignKey("alert_rules.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(sa.String(2048))
    format: Mapped[str] = mapped_column(sa.String(8))
    status: Mapped[str] = mapped_column(sa.String(12), default="pending")
    attempts: Mapped[int] = mapped_column(default=0)
    max_retries: Mapped[int]
    next_at: Mapped[float] = mapped_column(sa.Float(precision=53))
    claim: Mapped[str | None] = mapped_column(sa.String(32))
    claimed_until: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    history: Mapped[list[dict[str, Any]]] = mapped_column(sa.JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
