"""Forks: a job's ``parent_id`` and ``fork_step``, the parent's checkpoint it starts from
(``POST /jobs/{id}/fork``). Both nullable with no default: metadata-only on PostgreSQL,
however many jobs there are. Indexed by parent: a job lists its forks.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain columns, no foreign key: on SQLite a constraint needs a batch, which copies the
    # table, and dropping the old copy cascades to every job's events and points (and an
    # inline REFERENCES clause is not reflected with its options, so the models would
    # drift). Nothing deletes jobs; a parent id that names no job reads as a 404.
    op.add_column("jobs", sa.Column("parent_id", sa.String(length=40), nullable=True))
    op.add_column("jobs", sa.Column("fork_step", sa.Integer(), nullable=True))
    op.create_index("ix_jobs_parent_id", "jobs", ["parent_id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_parent_id", "jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("fork_step")
        batch.drop_column("parent_id")
