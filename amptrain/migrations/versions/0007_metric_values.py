"""Evaluation results as named series: ``metric_values``, one row per (job, attempt, step,
name), so a new evaluation metric (a plugin's) needs no migration; and ``jobs.eval_summary``,
the newest evaluation (``summary.eval`` in the API).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# SQLite has no BIGINT autoincrement: only "INTEGER PRIMARY KEY" is the rowid alias.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "metric_values",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=48), nullable=False),
        sa.Column("value", sa.Float(precision=53), nullable=True),
        sa.Column("time", sa.Float(precision=53), nullable=False),
        sa.Column("stream_ms", sa.BigInteger(), nullable=False),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name="fk_metric_values_job_id_jobs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_metric_values"),
        sa.UniqueConstraint(
            "job_id", "attempt", "step", "name", name="uq_metric_values_job_id_attempt_step_name"
        ),
    )
    op.create_index(
        "ix_metric_values_job_id_stream_ms_stream_seq",
        "metric_values",
        ["job_id", "stream_ms", "stream_seq"],
    )
    op.create_index("ix_metric_values_job_id_name_step", "metric_values", ["job_id", "name", "step"])
    # Nullable without a default: a metadata-only change, however many jobs there are.
    op.add_column("jobs", sa.Column("eval_summary", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("eval_summary")
    op.drop_index("ix_metric_values_job_id_name_step", table_name="metric_values")
    op.drop_index("ix_metric_values_job_id_stream_ms_stream_seq", table_name="metric_values")
    op.drop_table("metric_values")
