"""A series' chunk closes when a newer chunk of the series passes it, and on PostgreSQL the
record-order index leaves the open chunks other than the cursor's (issue 41: at most 8
bytes a value as a server holds it).

Revision 0021 closed a chunk when its last aligned step was recorded. A series recorded at
intervals (an evaluation every 100 steps, layer norms every 10: any interval whose
multiples miss a chunk's step 255) never records it, so every chunk of such a series stayed
open: unpacked, padded by ``slack`` to a whole open row (2 KiB), in the partition meant for
one row per live series. The writer now also closes the chunk that a newer chunk of its
series and attempt passes (:func:`amptrain.store.history.chunk_writes.write`); this
revision closes, packed, the chunks 0021 left open that a newer one has passed, in
primary-key batches of :data:`BATCH` (run again, it finds none), and every open chunk of
a job whose telemetry ended (the recorder now closes those at the job's end:
:func:`amptrain.store.history.chunk_writes.seal_job`).

The record-order index (0015) keys ``high``, which an open chunk's rewrite changes whenever
the chunk's highest value does (the cursor series' at every batch, a layer norm's at each
new high). PostgreSQL makes no update that changes an indexed column HOT, whatever the
partial index's predicate: the new version goes into every index of the partition and the
old one waits for a vacuum (256 live layer norms, 20,000 steps: 45.8 MiB held over the
compacted size, 18.6 without). So the open partition is partitioned by ``name`` in turn:
``metric_chunks_open_ms`` holds the open cursor chunks (``@ms``, the index's rows) and keeps
the index, ``metric_chunks_open_rest`` every other open chunk, without it; the closed
partition keeps its own. The reads name ``@ms`` as a literal, so the planner reads only the
two indexed partitions, in the index's order, as before. SQLite's index is unchanged: it
rewrites a chunk as a new row anyway.

Two more things kept open rows from being rewritten in place. A page held two of them
(``fillfactor`` 70), and a batch rewrites both: the second new version found no room and
went to another page, so the open partitions keep one row a page now (``fillfactor`` 30:
room for its next two versions). And a chunk that closed had its open row deleted and the
next chunk's inserted elsewhere, a page left behind per series per chunk until a vacuum:
now a chunk stays open until a newer one passes it, full or not, and on PostgreSQL the
newer one takes over its open row (:func:`amptrain.store.history.chunk_table.store`).

Downgrade: one open partition (0021's parameters) and the index on the whole table again,
and the chunks that 0021's rule holds open (their last aligned step not recorded) open
again, still packed (the reads decode either encoding), so that 0021's writer finds each
chunk's row as its rule says.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

from amptrain.store.history import chunk_writes
from amptrain.store.history.chunk_codec import CHUNK_STEPS
from amptrain.store.history.chunk_parts import MS

revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 5_000
"""Open chunks examined per statement (each up to 2 KiB read and rewritten)."""
_INDEX = "ix_metric_chunks_record_order"
_RECORD_ORDER = ["job_id", "kind", "attempt", "high", "chunk"]
_INDEXED = ("metric_chunks_closed", "metric_chunks_open_ms")
"""The partitions that keep the record-order index (each its own)."""
_OPEN_PARAMS = (
    "fillfactor = 30, toast_tuple_target = 8160, autovacuum_vacuum_scale_factor = 0, "
    "autovacuum_vacuum_threshold = 50"
)
"""The open partitions' storage parameters: 0021's (:data:`_OPEN_PARAMS_0021`) but one row a
page (see above)."""
_OPEN_PARAMS_0021 = _OPEN_PARAMS.replace("fillfactor = 30", "fillfactor = 70")
_COLUMNS = (
    "job_id, kind, name, chunk, attempt, first_step, last_step, count, non_finite, skipped, "
    "low, high, first, last, time_first, time_last, data, open"
)
_WHERE = sa.text(f"name = '{MS}'")
_KEY = "job_id, kind, name, chunk, attempt"
_OPEN_PASSED = sa.text(
    f"SELECT {_KEY}, skipped FROM metric_chunks o WHERE open AND ({_KEY}) > "
    "(:job_id, :kind, :name, :chunk, :attempt) AND EXISTS (SELECT 1 FROM metric_chunks n "
    "WHERE n.job_id = o.job_id AND n.kind = o.kind AND n.name = o.name "
    f"AND n.attempt = o.attempt AND n.chunk > o.chunk) ORDER BY {_KEY} LIMIT :n"
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index(_INDEX, table_name="metric_chunks")  # each partition's with it
        _set_open_aside()
        op.execute(
            "CREATE TABLE metric_chunks_open PARTITION OF metric_chunks FOR VALUES IN (true) "
            "PARTITION BY LIST (name)"
        )
        op.execute(
            "CREATE TABLE metric_chunks_open_ms PARTITION OF metric_chunks_open "
            f"FOR VALUES IN ('{MS}') WITH ({_OPEN_PARAMS})"
        )
        op.execute(
            "CREATE TABLE metric_chunks_open_rest PARTITION OF metric_chunks_open DEFAULT "
            f"WITH ({_OPEN_PARAMS})"
        )
        _copy_open_back()
        for table in _INDEXED:
            op.create_index(
                f"ix_{table}_record_order", table, _RECORD_ORDER, postgresql_where=_WHERE
            )
    s = Session(bind=op.get_bind())
    after = {"job_id": "", "kind": "", "name": "", "chunk": -1, "attempt": -1}
    while rows := s.execute(_OPEN_PASSED, {**after, "n": BATCH}).all():
        chunk_writes.seal(s, {(j, k, n, c, a): skipped for j, k, n, c, a, skipped in rows})
        after = dict(zip(after, rows[-1][:5], strict=True))
    # Jobs whose telemetry ended: nothing more comes, so their newest chunks close too, as
    # the recorder now closes them at a job's end.
    for (job_id,) in s.execute(sa.text("SELECT id FROM jobs WHERE telemetry_done")).all():
        chunk_writes.seal_job(s, job_id)
    s.flush()


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in _INDEXED:
            op.drop_index(f"ix_{table}_record_order", table_name=table)
        _set_open_aside()
        op.execute(
            "CREATE TABLE metric_chunks_open PARTITION OF metric_chunks FOR VALUES IN (true) "
            f"WITH ({_OPEN_PARAMS_0021})"
        )
        _copy_open_back()
        op.create_index(_INDEX, "metric_chunks", _RECORD_ORDER, postgresql_where=_WHERE)
    # A row that changes partition moves (PostgreSQL deletes and inserts it).
    op.execute(
        "UPDATE metric_chunks SET open = true WHERE NOT open "
        f"AND last_step <> chunk * {CHUNK_STEPS} + {CHUNK_STEPS - 1}"
    )


def _set_open_aside() -> None:
    """The open partition detached and renamed ``metric_chunks_open_0021`` with its key's
    index, their names freed for the new one's."""
    op.execute("ALTER TABLE metric_chunks DETACH PARTITION metric_chunks_open")
    op.execute("ALTER TABLE metric_chunks_open RENAME TO metric_chunks_open_0021")
    op.execute("ALTER INDEX metric_chunks_open_pkey RENAME TO metric_chunks_open_0021_pkey")


def _copy_open_back() -> None:
    """The set-aside open rows into the table again (the new partitions), the old dropped."""
    op.execute(
        f"INSERT INTO metric_chunks ({_COLUMNS}) SELECT {_COLUMNS} FROM metric_chunks_open_0021"
    )
    op.execute("DROP TABLE metric_chunks_open_0021")
