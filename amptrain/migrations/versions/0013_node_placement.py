"""``jobs.unplaced`` and ``jobs.dispatch_after``: a multi-node job (``nodes`` > 1) whose
first node could not reserve the others in time goes back to the queue without charging
its retry budget (each such attempt adds one to it, ``max_attempts + fallbacks +
unplaced``) and is not dispatched again before ``dispatch_after``, so a job that cannot
be placed waits visibly instead of spinning through the workers.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("unplaced", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("dispatch_after", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("dispatch_after")
        batch.drop_column("unplaced")
