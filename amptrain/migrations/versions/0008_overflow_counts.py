"""``jobs.overflow_counts``: per parameter, the skipped fp16 steps whose first non-finite
gradient (in backward order) was its (``summary.overflow_counts`` in the API).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable without a default: a metadata-only change, however many jobs there are.
    op.add_column("jobs", sa.Column("overflow_counts", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("overflow_counts")
