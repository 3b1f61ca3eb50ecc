"""``metric_chunks``: every series of a job (each per-step field, eval metric and layer
norm) in packed chunks of up to 256 aligned steps per attempt (see
:mod:`amptrain.store.history.chunk_codec`), and the rows recorded so far moved into them.

The move reads ``metric_points`` and ``metric_values`` in primary-key batches of
:data:`BATCH` rows (bounded memory, no planner statistics needed) and merges each batch
into the chunks it touches (:func:`amptrain.store.history.chunk_writes.append`). A step
already in a chunk keeps its value, so a move interrupted halfway (SQLite commits what it
did; PostgreSQL rolls the whole revision back) and run again finishes with the same
chunks.

The per-value tables stay and are still written (the reads of the API still come from
them): the downgrade drops ``metric_chunks`` and loses nothing.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

from amptrain.store.history import chunk_writes

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 50_000
"""Rows per batch of the move: a few tens of MiB of Python objects at most."""


def upgrade() -> None:
    op.create_table(
        "metric_chunks",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("chunk", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("first_step", sa.Integer(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("non_finite", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.Column("low", sa.Float(precision=53), nullable=True),
        sa.Column("high", sa.Float(precision=53), nullable=True),
        sa.Column("first", sa.Float(precision=53), nullable=True),
        sa.Column("last", sa.Float(precision=53), nullable=True),
        sa.Column("time_first", sa.Float(precision=53), nullable=True),
        sa.Column("time_last", sa.Float(precision=53), nullable=True),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_metric_chunks_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint(
            "job_id", "kind", "name", "chunk", "attempt", name="pk_metric_chunks"
        ),
    )
    move_rows(Session(bind=op.get_bind()))


def move_rows(s: Session) -> None:
    """Merge every recorded point and named value into the chunks, batch by batch."""
    present = {c["name"] for c in sa.inspect(s.connection()).get_columns("metric_points")}
    fields = [f for f in chunk_writes.STEP_SERIES if f in present]
    point_sql = sa.text(
        f"SELECT id, job_id, attempt, step, {', '.join(fields)} FROM metric_points "
        "WHERE id > :after ORDER BY id LIMIT :n"
    )
    value_sql = sa.text(
        "SELECT id, job_id, attempt, step, kind, name, value, time FROM metric_values "
        "WHERE id > :after ORDER BY id LIMIT :n"
    )
    for sql, as_points in ((point_sql, True), (value_sql, False)):
        after = 0
        while True:
            rows = [dict(r) for r in s.execute(sql, {"after": after, "n": BATCH}).mappings()]
            if not rows:
                break
            after = rows[-1]["id"]
            points, values = (rows, []) if as_points else ([], rows)
            chunk_writes.append(s, points, values, pack=True, keyed_open=False)
    s.flush()


def downgrade() -> None:
    op.drop_table("metric_chunks")
