"""``metric_rollups``: per series, attempt and aligned block of 1, 16 or 256 chunks, what a
downsampled read needs per bucket (see :mod:`amptrain.store.history.rollups`), built from
the chunks already stored.

The build (:func:`amptrain.store.history.rollup_rebuild.rebuild`) goes series by series,
:data:`~amptrain.store.history.rollup_rebuild.BATCH` chunk indexes at a time (bounded
memory), each write an upsert of what the chunks alone decide: interrupted (SQLite commits
what it did; PostgreSQL rolls the revision back) and run again, it ends with the same
rows. From this revision on the downsampled reads come from the roll-ups and the recorder
no longer writes ``metric_summaries`` (the table stays, unread, until the row tables go).

Downgrade: drops ``metric_rollups``; the summaries of steps recorded after the upgrade are
missing then, and revision 0005's reads fall back to the points for those jobs (their
summary state no longer matches the newest point), so nothing is lost.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

from amptrain.store.history import rollup_rebuild

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "metric_rollups",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("first_step", sa.Integer(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("non_finite", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.Column("flagged", sa.Integer(), nullable=False),
        sa.Column("first_flag", sa.Integer(), nullable=True),
        sa.Column("low", sa.Float(precision=53), nullable=True),
        sa.Column("low_step", sa.Integer(), nullable=True),
        sa.Column("high", sa.Float(precision=53), nullable=True),
        sa.Column("high_step", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_metric_rollups_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint(
            "job_id", "kind", "name", "level", "idx", "attempt", name="pk_metric_rollups"
        ),
    )
    s = Session(bind=op.get_bind())
    rollup_rebuild.rebuild(s, exemplars=False)  # their table comes with 0018
    s.flush()


def downgrade() -> None:
    op.drop_table("metric_rollups")
