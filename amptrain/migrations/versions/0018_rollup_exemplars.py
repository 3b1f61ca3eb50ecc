"""``metric_exemplars``: per step-kind roll-up block, the full records at its notable steps
(see :mod:`amptrain.store.history.exemplars`), so a downsampled bucket made of whole blocks
reads its points without a chunk lookup per series; built here from the chunks and
roll-ups already stored.

The build (:func:`amptrain.store.history.exemplar_build.rebuild`) goes job by job,
:data:`~amptrain.store.history.exemplar_build.BATCH` chunk indexes at a time (bounded
memory), each write an upsert of what the stored rows alone decide: interrupted (SQLite
commits what it did; PostgreSQL rolls the revision back) and run again, it ends with the
same rows. From this revision on the recorder keeps them in the batch's transaction.

Downgrade: drops ``metric_exemplars``; the reads of revision 0017 take every point from
the chunks, so nothing is lost.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

from amptrain.store.history import exemplar_build

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "metric_exemplars",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_metric_exemplars_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "level", "idx", "attempt", name="pk_metric_exemplars"),
    )
    s = Session(bind=op.get_bind())
    exemplar_build.rebuild(s)
    s.flush()


def downgrade() -> None:
    op.drop_table("metric_exemplars")
