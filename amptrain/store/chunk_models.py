"""The chunked metric store's tables: ``metric_chunks`` (every series of a job in packed
chunks, :mod:`amptrain.store.history.chunk_codec`) and ``metric_rollups`` (their
aggregates per aligned block, :mod:`amptrain.store.history.rollups`) and ``metric_exemplars``
(the step records at those blocks' notable steps). On the shared
:class:`~amptrain.store.models.Base` (the migrations' env imports this module)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from amptrain.contract.layers import LAYER_PATH_MAX
from amptrain.contract.metrics import VALUE_KIND_MAX
from amptrain.store.models import Base


class MetricChunk(Base):
    """Up to :data:`~amptrain.store.history.chunk_codec.CHUNK_STEPS` values of one series of
    one attempt, packed (:mod:`amptrain.store.history.chunk_codec`): the values of aligned
    steps ``chunk * 256 .. chunk * 256 + 255``. ``kind`` is ``step`` (a per-step field of the
    metric table, ``name`` the field, or reserved: :mod:`~amptrain.store.history.chunk_parts`)
    or a named series' kind. A series in step order is one range of the primary key, so no
    plan depends on statistics.

    ``open`` (no newer chunk of the series and attempt yet, and the job's telemetry not
    ended: :mod:`~amptrain.store.history.chunk_writes`, since migration 0022) is part of
    the key so that PostgreSQL can partition by it (0021, 0022): the open chunks, rewritten
    at every batch, a row a page in partitions of their own; the closed ones, written once,
    packed dense in the other. A chunk is one row, in one partition."""

    __tablename__ = "metric_chunks"
    __table_args__ = (
        # The record order (0015): per kind and attempt, the cursor chunks in cursor order.
        # On PostgreSQL the closed partition's and the open cursor chunks' own (0022): on
        # the other open chunks an index on ``high`` would keep their rewrites from being HOT.
        sa.Index(
            "ix_metric_chunks_record_order",
            "job_id",
            "kind",
            "attempt",
            "high",
            "chunk",
            sqlite_where=sa.text("name = '@ms'"),
            postgresql_where=sa.text("name = '@ms'"),
        ),
        {"postgresql_partition_by": "LIST (open)"},
    )

    job_id: Mapped[str] = mapped_column(
        sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    kind: Mapped[str] = mapped_column(sa.String(VALUE_KIND_MAX), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(LAYER_PATH_MAX), primary_key=True)
    chunk: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    attempt: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    first_step: Mapped[int]
    last_step: Mapped[int]
    count: Mapped[int]
    non_finite: Mapped[int]
    """Values that are null, NaN or infinite."""
    skipped: Mapped[int]
    """Steps of the chunk the optimizer skipped (step series; 0 for named series)."""
    low: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    """The lowest finite value; null when none is finite."""
    high: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    first: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    last: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    time_first: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    """Wall clock (epoch seconds) of the first and the last value."""
    time_last: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    data: Mapped[bytes] = mapped_column(sa.LargeBinary)
    open: Mapped[bool] = mapped_column(primary_key=True, autoincrement=False)


class MetricRollup(Base):
    """The aggregates of one series of one attempt over aligned chunks (see
    :mod:`amptrain.store.history.rollups`): level 0 is one chunk (256 steps), level 4 sixteen
    (4,096 steps), level 8 256 (65,536 steps); ``idx`` is ``chunk >> level``. What a
    downsampled read needs per bucket without decoding the chunks. The primary key is the
    only index: a level of a series is one range of it, so no plan depends on statistics."""

    __tablename__ = "metric_rollups"

    job_id: Mapped[str] = mapped_column(
        sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    kind: Mapped[str] = mapped_column(sa.String(VALUE_KIND_MAX), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(LAYER_PATH_MAX), primary_key=True)
    level: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    idx: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    attempt: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    first_step: Mapped[int]
    last_step: Mapped[int]
    count: Mapped[int]
    non_finite: Mapped[int]
    """Values that are null, NaN or infinite."""
    skipped: Mapped[int]
    """Steps the optimizer skipped (step series; 0 for named series)."""
    flagged: Mapped[int]
    """Steps skipped, or whose loss is not finite, or whose grad norm is NaN or infinite
    (:func:`amptrain.store.history.window.flagged`; step series, else 0)."""
    first_flag: Mapped[int | None]
    """The first flagged step."""
    low: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    """The lowest finite value (null when none is finite) and the first step holding it."""
    low_step: Mapped[int | None]
    high: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    """The highest finite value and the first step holding it."""
    high_step: Mapped[int | None]


class MetricExemplar(Base):
    """The full step records of one attempt at a roll-up block's notable steps (its first and
    last step, first flagged step and each extremes-kept field's lowest and highest step:
    the steps a downsampled bucket can choose), packed
    (:mod:`amptrain.store.history.exemplars`): a bucket made of whole blocks takes its
    points from here, not from a chunk lookup per series. Keyed like the step kind's
    roll-ups (level, ``idx = chunk >> level``, attempt); the primary key is the only index."""

    __tablename__ = "metric_exemplars"

    job_id: Mapped[str] = mapped_column(
        sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    level: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    idx: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    attempt: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    data: Mapped[bytes] = mapped_column(sa.LargeBinary)
