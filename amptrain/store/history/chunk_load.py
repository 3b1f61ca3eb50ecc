"""Fetching chunks of ``metric_chunks`` for a read, decoded into numpy arrays, by (name,
chunk) lookups of its primary key (job, kind, name, chunk, attempt): no plan depends on
planner statistics. Which chunks a read needs: :mod:`~amptrain.store.history.chunk_index`.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator, Mapping, Sequence
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


class Decoded(Mapping[Any, Chunk]):
    """Decoded chunks by key, held as one array per column, the chunks end to end in the
    order they were given: a read joins a series' chunks by slicing, not by concatenating
    hundreds of small arrays (a 10,000-step window is ~520 chunks)."""

    __slots__ = ("_at", "bounds", "chunk_keys", "floats", "nulled", "nulls", "positions", "steps")

    def __init__(
        self,
        keys: list[Any],
        columns: tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray],
        bounds: list[int],
        nulled: list[bool],
        positions: list[int | None],
    ) -> None:
        self.chunk_keys = keys
        """Each chunk's key, in order."""
        self.steps, self.floats, self.nulls = columns
        """Every chunk's steps (int64), values (float64, NaN where null) and null flags (a
        mapping's ``values`` is its chunks)."""
        self.bounds = bounds
        """Chunk ``i`` holds the columns' ``bounds[i]:bounds[i + 1]``."""
        self.nulled = nulled
        """Whether chunk ``i`` holds a null value."""
        self.positions = positions
        self._at = {key: i for i, key in enumerate(keys)}

    @classmethod
    def of(cls, chunks: Mapping[Any, Chunk]) -> Decoded:
        """Chunks decoded elsewhere (the chosen values of :mod:`chunk_pick`)."""
        held = list(chunks.values())
        bounds = [0, *itertools.accumulate(len(c.steps) for c in held)]
        columns = (
            numpy.concatenate([c.steps for c in held]) if held else _NO_STEPS,
            numpy.concatenate([c.values for c in held]) if held else _NO_VALUES,
            numpy.concatenate([_nulls_of(c) for c in held]) if held else _NO_NULLS,
        )
        nulled = [c.nulls is not None for c in held]
        return cls(list(chunks), columns, bounds, nulled, [c.position for c in held])

    def span(self, i: int) -> slice:
        """Chunk ``i``'s part of the columns."""
        return slice(self.bounds[i], self.bounds[i + 1])

    def __getitem__(self, key: Any) -> Chunk:
        i = self._at[key]
        at = self.span(i)
        nulls = self.nulls[at] if self.nulled[i] else None
        return Chunk(self.steps[at], self.floats[at], nulls, self.positions[i])

    def __iter__(self) -> Iterator[Any]:
        return iter(self.chunk_keys)

    def __len__(self) -> int:
        return len(self.chunk_keys)


Loaded = Decoded
"""Decoded chunks keyed by ``(name, chunk, attempt)``, in (name, attempt, chunk) order."""


def decode(first_aligned: int, data: bytes) -> Chunk:
    """:func:`amptrain.store.history.chunk_codec.decode` (which stays free of numpy for the
    recorder) into numpy arrays: several times faster per chunk."""
    return decode_many([(None, first_aligned, data)])[None]


def decode_many(chunks: Sequence[tuple[Any, int, bytes]]) -> Decoded:
    """Chunks ``(key, first aligned step, data)`` decoded, in their order. Per chunk only its
    header is read in Python and its values decompressed; the steps and null flags of all
    chunks are then one numpy operation each (a chunk's consecutive steps are a slice of
    one ramp of offsets), and the values of all chunks of one length un-shuffled by one."""
    keys: list[Any] = []
    firsts: list[int] = []
    counts: list[int] = []
    offsets: list[bytes] = []
    null_flags: list[bytes] = []
    nulled: list[bool] = []
    positions: list[int | None] = []
    raws: list[bytes] = []
    for key, first, data in chunks:
        flags, n, position, pos = chunk_codec.header(data)
        if flags & chunk_codec.GAPS:
            offsets.append(data[pos : pos + n])
            pos += n
        elif n:
            offsets.append(_RAMP[data[pos] : data[pos] + n])
            pos += 1
        has_nulls = bool(flags & chunk_codec.NULLS)
        null_flags.append(data[pos : pos + n] if has_nulls else _NO_FLAGS[:n])
        pos += n if has_nulls else 0
        packed = data[pos:]
        raws.append(zlib.decompress(packed) if flags & chunk_codec.PACKED else packed)
        keys.append(key)
        firsts.append(first)
        counts.append(n)
        nulled.append(has_nulls)
        positions.append(position)
    bounds = [0, *itertools.accumulate(counts)]
    steps = numpy.frombuffer(b"".join(offsets), numpy.uint8).astype(numpy.int64)
    steps += numpy.repeat(numpy.asarray(firsts, numpy.int64), counts)
    nulls = numpy.frombuffer(b"".join(null_flags), numpy.uint8).astype(bool)
    columns = (steps, _unshuffled(raws, counts, bounds), nulls)
    return Decoded(keys, columns, bounds, nulled, positions)


def _unshuffled(raws: list[bytes], counts: list[int], bounds: list[int]) -> numpy.ndarray:
    """The chunks' byte-shuffled float64 values, end to end: one un-shuffle per length."""
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(counts):
        by_length.setdefault(n, []).append(i)
    out = numpy.empty(bounds[-1])
    for n, members in by_length.items():
        raw = numpy.frombuffer(b"".join([raws[i] for i in members]), numpy.uint8)
        block = raw.reshape(len(members), 8, n).transpose(0, 2, 1).copy().view("<f8")
        if len(members) == len(counts):  # one length (nearly every read): already in order
            return block.reshape(-1).astype(numpy.float64, copy=False)
        at = numpy.asarray([bounds[i] for i in members])[:, None] + numpy.arange(n)
        out[at.reshape(-1)] = block.reshape(-1)
    return out


def _nulls_of(chunk: Chunk) -> numpy.ndarray:
    return chunk.nulls if chunk.nulls is not None else numpy.zeros(len(chunk.steps), bool)


_RAMP = bytes(range(CHUNK_STEPS))
"""Every step offset a chunk can hold: a chunk of consecutive steps is a slice of it."""
_NO_FLAGS = bytes(CHUNK_STEPS)
_NO_STEPS = numpy.empty(0, numpy.int64)
_NO_VALUES = numpy.empty(0)
_NO_NULLS = numpy.empty(0, bool)


def load(s: Session, job_id: str, kind: str, names: Sequence[str], chunks: Sequence[int]) -> Loaded:
    """Every attempt's chunks of the ``names`` series of ``kind`` at the chunk numbers
    ``chunks``, decoded (:func:`fetch`)."""
    return _loaded([(key, data) for key, data in fetch(s, job_id, kind, names, chunks)])


def load_range(
    s: Session, job_id: str, kind: str, names: Sequence[str], first: int, last: int
) -> Loaded:
    """Every attempt's chunks ``first..last`` (chunk numbers) of the ``names`` series of
    ``kind``, decoded: one statement, a primary-key range per name. A full-resolution
    window's chunks are consecutive: a range per name instead of a lookup per (name, chunk)
    pair (on PostgreSQL 0.9 ms instead of 4.8 for the 520 chunks of a 10,000-step window)."""
    if not names or first > last:
        return decode_many([])
    sql = _RANGE_PG if s.get_bind().dialect.name == "postgresql" else _RANGE
    params = {"job": job_id, "kind": kind, "names": list(names), "first": first, "last": last}
    rows = driver_rows(s.execute(sql, params))
    return _loaded(
        [
            ((name, chunk, attempt), d if d.__class__ is bytes else bytes(d))
            for name, chunk, attempt, d in rows
        ]
    )


def _loaded(rows: list[tuple[tuple[str, int, int], bytes]]) -> Loaded:
    """Fetched chunks decoded in (name, attempt, chunk) order: each series' chunks end to
    end, in step order per attempt."""
    rows.sort(key=lambda row: (row[0][0], row[0][2], row[0][1]))
    return decode_many([(key, key[1] * CHUNK_STEPS, data) for key, data in rows])


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
