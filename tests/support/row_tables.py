"""The per-value row tables as they were at revision 0016 (``metric_points``,
``metric_values``), owned by the test oracles: the product no longer has them (migration
0017 dropped them), the oracles still read what those rows gave. :func:`ensure` creates
them in a test database at the head revision; a database migrated to 0016 already has
them (the same DDL as migrations 0001-0016 left, as ORM classes for the oracles' queries).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from amptrain.contract.layers import LAYER_PATH_MAX
from amptrain.contract.metrics import EVAL_KIND, STEP_METRICS, VALUE_KIND_MAX, Metric

# SQLite has no BIGINT autoincrement: only "INTEGER PRIMARY KEY" is the rowid alias.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class RowBase(DeclarativeBase):
    """Its own metadata: never the product's (``amptrain.store.models.Base``). The constraint
    and index names are revision 0016's (a database at 0016 has these tables already)."""


def column_type(metric: Metric) -> sa.types.TypeEngine[Any]:
    """The SQL type of a metric's column."""
    types: dict[str, sa.types.TypeEngine[Any]] = {
        "int": sa.Integer(),
        "float": sa.Float(precision=53),
        "bool": sa.Boolean(),
        "bytes": sa.BigInteger(),
        "ints": sa.JSON(),
    }
    return types[metric.type]


class MetricPoint(RowBase):
    """One optimizer step of one attempt: a column per field of the metric table."""

    __table__ = sa.Table(
        "metric_points",
        RowBase.metadata,
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        # No foreign key: the jobs table is the product's metadata, not this one.
        sa.Column("job_id", sa.String(40), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("stream_ms", sa.BigInteger, nullable=False),
        sa.Column("stream_seq", sa.BigInteger, nullable=False),
        *(sa.Column(m.name, column_type(m), nullable=m.name != "step") for m in STEP_METRICS),
        sa.UniqueConstraint(
            "job_id", "attempt", "step", name="uq_metric_points_job_id_attempt_step"
        ),
        sa.Index(
            "ix_metric_points_job_id_stream_ms_stream_seq", "job_id", "stream_ms", "stream_seq"
        ),
        sa.Index("ix_metric_points_job_id_step", "job_id", "step"),
    )

    id: Mapped[int]
    job_id: Mapped[str]
    attempt: Mapped[int]
    stream_ms: Mapped[int]
    stream_seq: Mapped[int]
    step: Mapped[int]


class MetricValue(RowBase):
    """One value of a named series (an evaluation's or a layer norm's), unique per (job,
    kind, name, step, attempt)."""

    __tablename__ = "metric_values"
    __table_args__ = (
        sa.UniqueConstraint(
            "job_id",
            "kind",
            "name",
            "step",
            "attempt",
            name="uq_metric_values_job_id_kind_name_step_attempt",
        ),
        sa.Index(
            "ix_metric_values_job_id_stream_ms_stream_seq", "job_id", "stream_ms", "stream_seq"
        ),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(sa.String(40))
    attempt: Mapped[int]
    step: Mapped[int]
    kind: Mapped[str] = mapped_column(sa.String(VALUE_KIND_MAX), server_default=EVAL_KIND)
    name: Mapped[str] = mapped_column(sa.String(LAYER_PATH_MAX))
    value: Mapped[float | None] = mapped_column(sa.Float(precision=53))
    time: Mapped[float] = mapped_column(sa.Float(precision=53))
    stream_ms: Mapped[int] = mapped_column(sa.BigInteger)
    stream_seq: Mapped[int] = mapped_column(sa.BigInteger)


def ensure(bind: sa.Engine | sa.Connection) -> None:
    """Create the row tables where they are missing (a database at the head revision)."""
    RowBase.metadata.create_all(bind, checkfirst=True)
