"""``metric_chunks`` keyed by ``open`` too, and on PostgreSQL partitioned by it: the open
chunks apart from the closed ones (issue 41: at most 8 bytes a value as a server holds it).

The recorder rewrites each series' open chunk (uncompressed until its last aligned step
comes) at every batch; PostgreSQL keeps each old version until a vacuum and reused the
freed space for closed chunks, so the table's pages ended half dead (a live run of the
step fields held 18 bytes a value, 256 layer norms 60). Now:

- ``metric_chunks_open`` (``open``): a row per live series, rewritten in place, kept at
  one size by ``slack`` (:data:`_SLACK`) with room on its page for the next version
  (``fillfactor``), so the rewrite is a HOT update that the page prunes itself;
  ``toast_tuple_target = 8160`` keeps the chunk in the row (never compressed nor moved to
  TOAST at each rewrite, which left dead TOAST rows); vacuumed at 50 dead rows (a closed
  chunk's deleted open row, and a rewrite that changed an indexed ``high``).
- ``metric_chunks_closed``: each chunk inserted once when it closes (its open row deleted
  in the same transaction, :func:`amptrain.store.history.chunk_table.close`), dense.
- ``metric_exemplars``: room on each page and a vacuum at 50 dead rows (:data:`_EXEMPLARS`).

Readers query ``metric_chunks`` unchanged (the planner appends the two partitions). SQLite
gets the column and the key (the same writes), not the partitions: it reuses freed pages
itself. ``open`` is :func:`~amptrain.store.history.chunk_table.is_open` of each row.

The table is rebuilt (created anew, the rows copied, the old one dropped), in the
revision's transaction on PostgreSQL. Downgrade: the plain table and
the storage parameters of 0019 again.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07

"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from amptrain.store.history.chunk_codec import CHUNK_STEPS

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    "job_id, kind, name, chunk, attempt, first_step, last_step, count, non_finite, skipped, "
    "low, high, first, last, time_first, time_last, data"
)
_OPEN = f"last_step <> chunk * {CHUNK_STEPS} + {CHUNK_STEPS - 1}"
"""``chunk_table.is_open`` in SQL."""
_VACUUM = "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000"
"""Revision 0019's parameters, now on each partition (a partitioned table takes none)."""
_OPEN_ROW_BYTES = 8 * CHUNK_STEPS + 8
"""What an open chunk's ``data`` and ``slack`` hold together on PostgreSQL: a chunk's
open encoding with every value (the header and a name's place), so an open chunk's row
keeps one size from its first write to its last (one with null flags or step gaps, rare,
grows up to 512 bytes more: still room for its next version, below). Two such rows fill a
page to 55 %; ``fillfactor = 70`` puts no third beside them, so every page keeps room for
one more version of either, and prunes the old one when the room is used."""
_SLACK = (
    "bytea GENERATED ALWAYS AS (CASE WHEN open THEN substring(decode(repeat('00', "
    f"{_OPEN_ROW_BYTES}), 'hex') FROM 1 FOR greatest(0, {_OPEN_ROW_BYTES} - octet_length(data))) "
    "END) STORED"
)
"""Zero bytes that fill an open chunk's row up to :data:`_OPEN_ROW_BYTES` (null once closed),
kept by the server: no statement writes or reads it. Without it the chunk's row grew at
every rewrite (a 10-step batch adds 80 bytes), so the new version did not fit the page
that held the old one and went elsewhere, a dead version for vacuum to find (a fifth of the
rewrites); at one size, each rewrite is a HOT update the page prunes itself."""
_EXEMPLARS = "fillfactor = 70, autovacuum_vacuum_threshold = 50"
"""``metric_exemplars``: a block's blob (~2 KiB of step records) is rewritten at every batch
while the block is open and grows as it gains notable steps, so a full page sent its next
version elsewhere (a quarter of the rewrites, and a live run's exemplars held 20 times
their size); room on the page keeps the rewrite HOT, and a vacuum at each naptime frees
the rest instead of waiting for a thousand dead versions."""
_PARTITIONS = {
    "metric_chunks_open": "true) WITH (fillfactor = 70, toast_tuple_target = 8160, "
    "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 50",
    "metric_chunks_closed": f"false) WITH ({_VACUUM}",
}


def upgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    _set_aside()
    _create(open_key=True)
    if pg:
        op.execute(f"ALTER TABLE metric_chunks ADD COLUMN slack {_SLACK}")
        for name, spec in _PARTITIONS.items():
            op.execute(f"CREATE TABLE {name} PARTITION OF metric_chunks FOR VALUES IN ({spec})")
        op.execute(f"ALTER TABLE metric_exemplars SET ({_EXEMPLARS})")
    _index()
    op.execute(
        f"INSERT INTO metric_chunks ({_COLUMNS}, open) "
        f"SELECT {_COLUMNS}, {_OPEN} FROM metric_chunks_0020"
    )
    op.drop_table("metric_chunks_0020")


def downgrade() -> None:
    _set_aside()
    _create(open_key=False)
    _index()
    op.execute(f"INSERT INTO metric_chunks ({_COLUMNS}) SELECT {_COLUMNS} FROM metric_chunks_0020")
    op.drop_table("metric_chunks_0020")  # the partitions go with it
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE metric_chunks SET ({_VACUUM})")
        op.execute("ALTER TABLE metric_exemplars RESET (fillfactor)")
        op.execute(f"ALTER TABLE metric_exemplars SET ({_VACUUM})")


def _set_aside() -> None:
    """The table as it is renamed ``metric_chunks_0020``, its index and key names freed."""
    op.drop_index("ix_metric_chunks_record_order", table_name="metric_chunks")
    op.rename_table("metric_chunks", "metric_chunks_0020")
    if op.get_bind().dialect.name == "postgresql":  # SQLite's key index has no name
        op.execute("ALTER INDEX pk_metric_chunks RENAME TO pk_metric_chunks_0020")


def _create(open_key: bool) -> None:
    key = ["job_id", "kind", "name", "chunk", "attempt"] + (["open"] if open_key else [])
    partitioned: dict[str, Any] = {"postgresql_partition_by": "LIST (open)"} if open_key else {}
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
        *([sa.Column("open", sa.Boolean(), nullable=False)] if open_key else []),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_metric_chunks_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint(*key, name="pk_metric_chunks"),
        **partitioned,
    )


def _index() -> None:
    """Revision 0015's record-order index (on PostgreSQL, one per partition)."""
    where = sa.text("name = '@ms'")
    op.create_index(
        "ix_metric_chunks_record_order",
        "metric_chunks",
        ["job_id", "kind", "attempt", "high", "chunk"],
        sqlite_where=where,
        postgresql_where=where,
    )
