"""The chunks hold everything a cursor page returns: each record's cursor, a named record's
time and the per-rank memory list as reserved series (:mod:`amptrain.store.history.chunk_parts`),
each named series' place in its records, and the record-order index.

The backfill reads ``metric_points`` and ``metric_values`` in primary-key batches (bounded
memory, no planner statistics needed; a value batch ends at a record's end, so a record's
places come from the whole record) and merges each batch into the chunks
(:func:`amptrain.store.history.chunk_writes.append`): a step already in a chunk keeps its
value, so a backfill interrupted halfway and run again finishes with the same chunks.

Downgrade: drops the index and the reserved series, and strips the places from the named
series' chunks (0014's format); the per-value rows, still written, lose nothing.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07

"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

from amptrain.store.history import chunk_codec, chunk_writes
from amptrain.store.history.chunk_parts import MS, RESERVED

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 50_000
"""Rows per batch of the backfill: a few tens of MiB of Python objects at most."""
_WHERE = sa.text(f"name = '{MS}'")


def upgrade() -> None:
    op.create_index(
        "ix_metric_chunks_record_order",
        "metric_chunks",
        ["job_id", "kind", "attempt", "high", "chunk"],
        sqlite_where=_WHERE,
        postgresql_where=_WHERE,
    )
    backfill(Session(bind=op.get_bind()))


def backfill(s: Session) -> None:
    """Merge every recorded point's and named value's record series into the chunks."""
    point_sql = sa.text(
        "SELECT id, job_id, attempt, step, time, stream_ms, stream_seq, memory_peak_per_rank "
        "FROM metric_points WHERE id > :after ORDER BY id LIMIT :n"
    )
    value_sql = sa.text(
        "SELECT id, job_id, attempt, step, kind, name, value, time, stream_ms, stream_seq "
        "FROM metric_values WHERE id > :after ORDER BY id LIMIT :n"
    )
    after = 0
    while rows := _batch(s, point_sql, after, whole_records=False):
        after = rows[-1]["id"]
        chunk_writes.append(s, rows, [], pack=True, step_fields=(), keyed_open=False)
    after = 0
    while rows := _batch(s, value_sql, after, whole_records=True):
        after = rows[-1]["id"]
        chunk_writes.append(s, [], rows, pack=True, keyed_open=False)
    s.flush()


def _batch(s: Session, sql: Any, after: int, whole_records: bool) -> list[dict[str, Any]]:
    rows = [dict(r) for r in s.execute(sql, {"after": after, "n": BATCH}).mappings()]
    if whole_records and len(rows) == BATCH:
        # The last record may go on in the next batch: leave it whole to that one.
        last = _record(rows[-1])
        cut = len(rows)
        while cut > 0 and _record(rows[cut - 1]) == last:
            cut -= 1
        rows = rows[:cut] or rows
    return rows


def _record(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["job_id"], row["kind"], row["stream_ms"], row["stream_seq"])


def downgrade() -> None:
    op.drop_index("ix_metric_chunks_record_order", table_name="metric_chunks")
    op.execute(sa.text(f"DELETE FROM metric_chunks WHERE name LIKE '{RESERVED}%'"))
    strip_places(Session(bind=op.get_bind()))


def strip_places(s: Session) -> None:
    """Rewrite the named series' chunks without their place (flag ``ORDER``), batch by batch
    in primary-key order."""
    conn = s.connection()
    select = sa.text(
        "SELECT job_id, kind, name, chunk, attempt, data FROM metric_chunks "
        "WHERE kind <> 'step' AND (job_id, kind, name, chunk, attempt) > "
        "(:job_id, :kind, :name, :chunk, :attempt) "
        "ORDER BY job_id, kind, name, chunk, attempt LIMIT :n"
    )
    update = sa.text(
        "UPDATE metric_chunks SET data = :data WHERE job_id = :job_id AND kind = :kind "
        "AND name = :name AND chunk = :chunk AND attempt = :attempt"
    )
    key = {"job_id": "", "kind": "", "name": "", "chunk": -1, "attempt": -1}
    while rows := [dict(r) for r in conn.execute(select, {**key, "n": BATCH}).mappings()]:
        changed = [r | {"data": _strip(bytes(r["data"]))} for r in rows]
        changed = [r for r in changed if r["data"] is not None]
        if changed:
            conn.execute(update, changed)
        key = {k: rows[-1][k] for k in key}


def _strip(data: bytes) -> bytes | None:
    version, flags, n = chunk_codec.HEADER.unpack_from(data)
    if not flags & chunk_codec.ORDER:
        return None
    rest = data[chunk_codec.HEADER.size + chunk_codec.POSITION.size :]
    return chunk_codec.HEADER.pack(version, flags & ~chunk_codec.ORDER, n) + rest
