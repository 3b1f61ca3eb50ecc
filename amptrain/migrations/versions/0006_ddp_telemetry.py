"""Metric points of data-parallel runs: ``world_size`` and ``memory_peak_per_rank``.

Null for one-device runs (and for every point recorded before). The memory columns of a
data-parallel run already hold the maximum over its ranks; ``memory_peak_per_rank`` is
each rank's peak, in rank order.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable columns without a default: a metadata-only change on both databases, however
    # many points the table holds.
    op.add_column("metric_points", sa.Column("world_size", sa.Integer(), nullable=True))
    op.add_column("metric_points", sa.Column("memory_peak_per_rank", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("metric_points") as batch:
        batch.drop_column("memory_peak_per_rank")
        batch.drop_column("world_size")
