"""``metric_values.kind``: the table holds two kinds of named series, ``eval`` (every row
so far) and ``layer_grad_norm`` (per-layer gradient norms, named by module path, so the
name widens to 128 characters). The unique key includes the kind and is ordered (job, kind,
name, step, attempt) so that it is also the reads' index: the series of one kind and name
in step order, and the effective series' lookup of a newer attempt (with attempt second,
SQLite answered that lookup by scanning every later attempt's row: 17 s for 12,000 layer
norms). It replaces the (job, name, step) index.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: metadata-only on PostgreSQL 11+, however many values there are;
    # widening a varchar does not rewrite the table either. SQLite copies the table (batch).
    with op.batch_alter_table("metric_values") as batch:
        batch.add_column(
            sa.Column("kind", sa.String(length=16), server_default="eval", nullable=False)
        )
        batch.alter_column(
            "name", existing_type=sa.String(length=48), type_=sa.String(length=128)
        )
        batch.drop_constraint("uq_metric_values_job_id_attempt_step_name", type_="unique")
        batch.create_unique_constraint(
            "uq_metric_values_job_id_kind_name_step_attempt",
            ["job_id", "kind", "name", "step", "attempt"],
        )
        batch.drop_index("ix_metric_values_job_id_name_step")


def downgrade() -> None:
    op.execute("DELETE FROM metric_values WHERE kind <> 'eval'")
    with op.batch_alter_table("metric_values") as batch:
        batch.create_index("ix_metric_values_job_id_name_step", ["job_id", "name", "step"])
        batch.drop_constraint("uq_metric_values_job_id_kind_name_step_attempt", type_="unique")
        batch.create_unique_constraint(
            "uq_metric_values_job_id_attempt_step_name", ["job_id", "attempt", "step", "name"]
        )
        batch.alter_column(
            "name", existing_type=sa.String(length=128), type_=sa.String(length=48)
        )
        batch.drop_column("kind")
