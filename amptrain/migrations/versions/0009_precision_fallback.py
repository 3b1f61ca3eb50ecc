"""``jobs.precision_override`` and ``jobs.fallbacks``: the precision a job's next attempts
train in after fp16 became unhealthy (``health.fallback``), and how many such fallbacks it
had (each adds one attempt to its retry budget: a fallback is not a failed attempt).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("precision_override", sa.String(8), nullable=True))
    op.add_column(
        "jobs", sa.Column("fallbacks", sa.Integer(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("fallbacks")
        batch.drop_column("precision_override")
