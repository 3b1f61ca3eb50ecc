"""Fetching chunks of ``metric_chunks`` for a read, decoded into numpy arrays, by (name,
chunk) lookups of its primary key (job, kind, name, chunk, attempt): no plan depends on
planner statistics. Which chunks a read needs: :mod:`~amptrain.store.history.chunk_index`.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.store.history import chunk_codec
from amptrain.store.history.chunk_codec import CHUNK_STEPS

IN_CHUNK = 500
"""Chunk numbers per ``IN`` list on SQLite (times the names: far below its 32766 limit)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One decoded chunk: its steps (int64, ascending), values (float64; NaN where null),
    null flags (None: no value is null) and a named series' place in its records."""

    steps: numpy.ndarray
    values: numpy.ndarray
    nulls: numpy.ndarray | None
    position: int | None


Loaded = dict[tuple[str, int, int], Chunk]
"""Decoded chunks by ``(name, chunk, attempt)``."""


def decode(first_aligned: int, data: bytes) -> Chunk:
    """:func:`amptrain.store.history.chunk_codec.decode` (which stays free of numpy for the
    recorder) into numpy arrays: several times faster per chunk."""
    return decode_many([(None, first_aligned, data)])[None]


def decode_many(chunks: list[tuple[Any, int, bytes]]) -> dict[Any, Chunk]:
    """Chunks ``(key, first aligned step, data)`` decoded, by key: the headers one by one,
    the values of all chunks of one length un-shuffled by one numpy operation (a window's
    points touch thousands of chunks)."""
    parsed = [(key, *_parse(first, data)) for key, first, data in chunks]
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(parsed):
        by_length.setdefault(len(p[1]), []).append(i)
    values: list[numpy.ndarray] = [_NO_VALUES] * len(parsed)
    for n, members in by_length.items():
        raw = numpy.frombuffer(b"".join(parsed[i][4] for i in members), numpy.uint8)
        rows = raw.reshape(len(members), 8, n).transpose(0, 2, 1).copy().view("<f8")
        block = rows.reshape(len(members), n).astype(numpy.float64, copy=False)
        for row, i in enumerate(members):
            values[i] = block[row]
    return {p[0]: Chunk(p[1], values[i], p[2], p[3]) for i, p in enumerate(parsed)}


_NO_VALUES = numpy.empty(0)


def _parse(
    first_aligned: int, data: bytes
) -> tuple[numpy.ndarray, numpy.ndarray | None, int | None, bytes]:
    """A chunk's steps, null flags, place and shuffled value bytes."""
    flags, n, position, pos = chunk_codec.header(data)
    if flags & chunk_codec.GAPS:
        steps = numpy.frombuffer(data, numpy.uint8, n, pos).astype(numpy.int64) + first_aligned
        pos += n
    else:
        start = first_aligned + (data[pos] if n else 0)
        steps = numpy.arange(start, start + n, dtype=numpy.int64)
        pos += 1 if n else 0
    nulls = None
    if flags & chunk_codec.NULLS:
        nulls = numpy.frombuffer(data, numpy.uint8, n, pos).astype(bool)
        pos += n
    packed = data[pos:]
    raw = zlib.decompress(packed) if flags & chunk_codec.PACKED else packed
    return steps, nulls, position, raw


def load(s: Session, job_id: str, kind: str, names: Sequence[str], chunks: Sequence[int]) -> Loaded:
    """Every attempt's chunks of the ``names`` series of ``kind`` at the chunk numbers
    ``chunks``, decoded (:func:`fetch`)."""
    found = [
        (key, key[1] * CHUNK_STEPS, data) for key, data in fetch(s, job_id, kind, names, chunks)
    ]
    return decode_many(found)


def load_range(
    s: Session, job_id: str, kind: str, names: Sequence[str], first: int, last: int
) -> Loaded:
    """Every attempt's chunks ``first..last`` (chunk numbers) of the ``names`` series of
    ``kind``, decoded: one statement, a primary-key range per name. A full-resolution
    window's chunks are consecutive: a range per name instead of a lookup per (name, chunk)
    pair (on PostgreSQL 0.9 ms instead of 4.8 for the 520 chunks of a 10,000-step window)."""
    if not names or first > last:
        return {}
    sql = _RANGE_PG if s.get_bind().dialect.name == "postgresql" else _RANGE
    params = {"job": job_id, "kind": kind, "names": list(names), "first": first, "last": last}
    rows = driver_rows(s.execute(sql, params))
    return decode_many(
        [
            ((name, chunk, attempt), chunk * CHUNK_STEPS, d if d.__class__ is bytes else bytes(d))
            for name, chunk, attempt, d in rows
        ]
    )


def driver_rows(result: Any) -> list[Any]:
    """A statement's rows as the driver's tuples, not SQLAlchemy's rows: a layer-norm window
    fetches ~90,000 chunks, and the rows' wrapping cost a third of that. The statement still
    runs through the session (its events, the plan tests, see it)."""
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()


def fetch(
    s: Session, job_id: str, kind: str, names: Sequence[str], chunks: Sequence[int]
) -> list[tuple[tuple[str, int, int], bytes]]:
    """The stored bytes of every attempt's chunks of the ``names`` series of ``kind`` at the
    chunk numbers ``chunks``, by ``(name, chunk, attempt)``: one statement (per
    :data:`IN_CHUNK` numbers on SQLite), index lookups by (name, chunk) pairs of the
    primary key."""
    if not names or not chunks:
        return []
    ordered = sorted(set(chunks))
    if s.get_bind().dialect.name == "postgresql":
        params = {"job": job_id, "kind": kind, "names": list(names), "chunks": ordered}
        batches = [s.execute(_LOAD_PG, params)]
    else:
        batches = [
            s.execute(
                _LOAD,
                {
                    "job": job_id,
                    "kind": kind,
                    "names": list(names),
                    "chunks": ordered[i : i + IN_CHUNK],
                },
            )
            for i in range(0, len(ordered), IN_CHUNK)
        ]
    return [
        ((name, chunk, attempt), data if data.__class__ is bytes else bytes(data))
        for rows in batches
        for name, chunk, attempt, data in driver_rows(rows)  # one fetchall, not one per row
    ]


# PostgreSQL: one primary-key lookup per (name, chunk) pair, forced by LATERAL with OFFSET
# 0 (which keeps the planner from flattening it). Without statistics, ``name IN (...) AND
# chunk IN (...)``, or a plain join, filtered the job's whole kind (20-75 ms at 300k steps).
# The pairs are the names' and chunks' cross join made by the server: sent as two arrays of
# every pair, a 1M-step run's layer-norm window (132 series x 685 chunks) spent ~0.5 s
# (loaded) of its client's CPU building and sending them.
_LOAD_PG = sa.text(
    "SELECT c.name, c.chunk, c.attempt, c.data FROM unnest(CAST(:names AS text[])) AS n(name) "
    "CROSS JOIN unnest(CAST(:chunks AS int[])) AS k(chunk) CROSS JOIN LATERAL (SELECT m.name, "
    "m.chunk, m.attempt, m.data FROM metric_chunks m WHERE m.job_id = :job AND m.kind = :kind "
    "AND m.name = n.name AND m.chunk = k.chunk OFFSET 0) AS c"
)
_LOAD = sa.text(
    "SELECT name, chunk, attempt, data FROM metric_chunks WHERE job_id = :job AND kind = :kind "
    "AND name IN :names AND chunk IN :chunks"
).bindparams(sa.bindparam("names", expanding=True), sa.bindparam("chunks", expanding=True))
# A LATERAL range per name, OFFSET 0 keeping it one (as _LOAD_PG): never a scan of the kind.
_RANGE_PG = sa.text(
    "SELECT c.name, c.chunk, c.attempt, c.data FROM unnest(CAST(:names AS text[])) AS k(name) "
    "CROSS JOIN LATERAL (SELECT m.name, m.chunk, m.attempt, m.data FROM metric_chunks m "
    "WHERE m.job_id = :job AND m.kind = :kind AND m.name = k.name "
    "AND m.chunk BETWEEN :first AND :last OFFSET 0) AS c"
)
_RANGE = sa.text(
    "SELECT name, chunk, attempt, data FROM metric_chunks WHERE job_id = :job AND kind = :kind "
    "AND name IN :names AND chunk BETWEEN :first AND :last"
).bindparams(sa.bindparam("names", expanding=True))
