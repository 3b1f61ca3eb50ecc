"""Appending a batch's values to the series' chunks (``metric_chunks``), inside the caller's
transaction: the recorder's batch, or migrations 0014/0015 moving old rows.

Which series exist is the metric table's decision: every per-step field of
:data:`~amptrain.contract.metrics.STEP_METRICS` that is a number (:data:`STEP_SERIES`: all
but ``step`` itself, the key) is a ``step`` series; each evaluation metric and each layer's
gradient norm is a series of its kind (:data:`~amptrain.contract.metrics.VALUE_KINDS`); the
reserved series of :mod:`~amptrain.store.history.chunk_parts` keep what else a page shows
(cursors, record times, the per-rank memory list).

A value lands in the chunk ``(job, kind, name, step // 256, attempt)``: the key alone says
where it goes, so at-least-once delivery is harmless. The touched chunks are read by
primary key, decoded, given the steps they lack (:mod:`~amptrain.store.history.chunk_merge`:
a step already there keeps its first value, as ``ON CONFLICT DO NOTHING`` did for rows),
re-encoded and upserted in one executemany; a replayed or re-sent range adds no step and
writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from amptrain.store.db import upsert_many
from amptrain.store.history import chunk_codec, chunk_merge
from amptrain.store.history.block_stats import Row
from amptrain.store.history.chunk_codec import CHUNK_STEPS, Decoded
from amptrain.store.history.chunk_merge import Gained, Span
from amptrain.store.history.chunk_merge import Stored as Stored
from amptrain.store.history.chunk_parts import SHIFT as _SHIFT
from amptrain.store.history.chunk_parts import STEP_KIND as STEP_KIND
from amptrain.store.history.chunk_parts import STEP_SERIES as STEP_SERIES
from amptrain.store.history.chunk_parts import Key, Part, collect
from amptrain.store.history.point_columns import PointColumns
from amptrain.store.history.rollup_stats import STATS


def append(
    s: Session,
    points: Sequence[Mapping[str, Any]],
    values: Sequence[Mapping[str, Any]],
    pack: bool = False,
    step_fields: Sequence[str] = STEP_SERIES,
) -> int:
    """Add the points and the named values to their chunks (what each holds:
    :func:`~amptrain.store.history.chunk_parts.collect`); the number of chunks written.
    ``pack``: as for :func:`merge`; ``step_fields``: the metric table's series to write
    (migration 0015 writes only the reserved ones). The recorder writes through
    :func:`amptrain.store.history.rollups.record`, which also keeps the roll-ups."""
    return len(write(s, collect(points, values, step_fields), pack))


Gains = dict[Key, Gained]
"""Per chunk the steps a write added to it (:data:`~amptrain.store.history.chunk_merge.Gained`)."""


def gather(
    points: Sequence[Mapping[str, Any]],
    values: Sequence[Mapping[str, Any]],
    columns: Sequence[PointColumns] = (),
) -> dict[Key, Part]:
    """The new values of each chunk, from the recorder's points (rows and columns) and
    named values."""
    return collect(points, values, columns=columns)


def write(
    s: Session,
    parts: Mapping[Key, Part],
    pack: bool = False,
    last: dict[Key, int] | None = None,
    blocks: Mapping[Key, Row] | None = None,
) -> Gains:
    """Merge ``parts`` (:func:`gather`) into their stored chunks and upsert the chunks that
    changed; what each gained (the roll-ups' upkeep reads it). ``last``, when given, gets
    the last step each chunk held before (a chunk not stored before is absent); ``blocks``:
    the parts' aggregates where taken (:func:`~amptrain.store.history.block_stats.part_blocks`),
    whose lowest and highest value and non-finite count a chunk that gains its whole part
    takes instead of a pass over its new values."""
    if not parts:
        return {}
    spans: dict[Key, Span] = {}
    stored = read(s, list(parts), spans)
    if last is not None:
        last.update((key, d.steps[-1]) for key, (d, _, _) in stored.items() if d.steps)
    merged, gains = _merge(parts, stored)
    new = _gained_spans(parts, gains, blocks) if blocks else {}
    upsert(s, _rows(merged, stored, pack, spans, new))
    return gains


def _gained_spans(
    parts: Mapping[Key, Part], gains: Gains, blocks: Mapping[Key, Row]
) -> dict[Key, Span]:
    """The :data:`Span` of what each chunk gained, for those that gained their whole part
    (rising steps: what they gained is the part, in order) from its block's aggregates."""
    out: dict[Key, Span] = {}
    for key, row in blocks.items():
        new = gains.get(key)
        if new is not None and len(new) == len(parts[key].steps):
            out[key] = (row[_LOW], row[_HIGH], row[_NON_FINITE])
    return out


_LOW, _HIGH, _NON_FINITE = (STATS.index(c) for c in ("low", "high", "non_finite"))


def read(s: Session, keys: list[Key], spans: dict[Key, Span] | None = None) -> dict[Key, Stored]:
    """The stored chunks among ``keys``, by primary key: on PostgreSQL one statement for all
    (a join with the unnested keys), on SQLite one per chunk number and attempt. ``spans``,
    when given, also gets each chunk's :data:`Span` as stored."""
    conn: Any = s.connection().connection.driver_connection
    out: dict[Key, Stored] = {}
    if spans is None:
        spans = {}
    if s.get_bind().dialect.name == "sqlite":
        # One statement per chunk number (its names in one IN list): a batch reaches ~15
        # series of a chunk, and a statement's own cost was most of a live batch's read.
        by_chunk: dict[tuple[str, str, int, int], list[str]] = {}
        for job_id, kind, name, chunk, attempt in keys:
            by_chunk.setdefault((job_id, kind, chunk, attempt), []).append(name)
        for (job_id, kind, chunk, attempt), names in by_chunk.items():
            for i in range(0, len(names), _NAMES_PER_READ):
                some = names[i : i + _NAMES_PER_READ]
                sql = _ONE.format(marks=", ".join("?" * len(some)))
                for name, first_time, last_time, data, *span in conn.execute(
                    sql, (job_id, kind, chunk, attempt, *some)
                ):
                    decoded = chunk_codec.decode(chunk << _SHIFT, data)
                    key = (job_id, kind, name, chunk, attempt)
                    out[key] = (decoded, first_time, last_time)
                    spans[key] = tuple(span)
        return out
    columns = [list(c) for c in zip(*keys, strict=True)]
    # Binary results: the chunks' bytes as they are, not hex text encoded by the server and
    # decoded here (a third of the read's CPU on each side).
    with conn.cursor(binary=True) as cur:
        for job_id, kind, name, chunk, attempt, first_time, last_time, data, *span in cur.execute(
            _MANY, columns
        ):
            decoded = chunk_codec.decode(chunk << _SHIFT, bytes(data))
            key = (job_id, kind, name, chunk, attempt)
            out[key] = (decoded, first_time, last_time)
            spans[key] = tuple(span)
    return out


_KEY = ("job_id", "kind", "name", "chunk", "attempt")
_ONE = (
    "SELECT name, time_first, time_last, data, low, high, non_finite FROM metric_chunks "
    "WHERE job_id = ? AND kind = ? AND chunk = ? AND attempt = ? AND name IN ({marks})"
)
_NAMES_PER_READ = 500
"""Names per SQLite read at most (a layer-norm record can name a few thousand)."""
_MANY = (
    "SELECT c.job_id, c.kind, c.name, c.chunk, c.attempt, c.time_first, c.time_last, c.data, "
    "c.low, c.high, c.non_finite "
    "FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::int[]) "
    "AS k(job_id, kind, name, chunk, attempt) JOIN metric_chunks c ON c.job_id = k.job_id "
    "AND c.kind = k.kind AND c.name = k.name AND c.chunk = k.chunk AND c.attempt = k.attempt"
)


def merge(
    parts: Mapping[Key, Part], stored: Mapping[Key, Stored], pack: bool = False
) -> list[tuple[Any, ...]]:
    """The rows (:data:`COLUMNS`) of every chunk that gains a step; a step already stored
    (or repeated in ``parts``) keeps its first value. ``pack``: compress every chunk, open
    or not (the migration's, whose chunks will not grow)."""
    return _rows(_merge(parts, stored)[0], stored, pack)


def _merge(
    parts: Mapping[Key, Part], stored: Mapping[Key, Stored]
) -> tuple[dict[Key, Stored], Gains]:
    """Every chunk that changes (:func:`chunk_merge.merged`) and the steps each gains."""
    merged: dict[Key, Stored] = {}
    gains: Gains = {}
    rising: dict[int, bool] = {}
    for key, part in parts.items():
        m = chunk_merge.merged(part, stored.get(key), rising)
        if m is not None:
            merged[key], new = m
            if new:
                gains[key] = new
    return merged, gains


def _rows(
    merged: Mapping[Key, Stored],
    stored: Mapping[Key, Stored],
    pack: bool,
    spans: Mapping[Key, Span] | None = None,
    new: Mapping[Key, Span] | None = None,
) -> list[tuple[Any, ...]]:
    seen: dict[Key, int] = {}
    spans = spans or {}
    new = new or {}
    return [
        _row(
            key,
            *m,
            _skipped(key, merged, stored, seen),
            pack,
            chunk_merge.merged_span(m[0], stored.get(key), spans.get(key), new.get(key)),
        )
        for key, m in merged.items()
    ]


def _skipped(
    key: Key, merged: Mapping[Key, Stored], stored: Mapping[Key, Stored], seen: dict[Key, int]
) -> int:
    """How many of the chunk's steps were skipped: from the same attempt's ``skipped``
    series (written with every step series of a point, so over the same steps); counted
    once per chunk in ``seen``, not once per series."""
    if key[1] != STEP_KIND:
        return 0
    flag_key = (key[0], STEP_KIND, "skipped", key[3], key[4])
    count = seen.get(flag_key)
    if count is None:
        flags = merged.get(flag_key) or stored.get(flag_key)
        count = seen[flag_key] = 0 if flags is None else flags[0].values.count(1.0)
    return count


def _closed(key: Key, d: Decoded) -> bool:
    """The chunk's last aligned step is recorded: an attempt records its steps in order,
    so no later batch adds to it (a rare late one still can: it is then repacked)."""
    return d.steps[-1] == (key[3] << _SHIFT) + CHUNK_STEPS - 1


def _row(
    key: Key,
    d: Decoded,
    t_first: float | None,
    t_last: float | None,
    skipped: int,
    pack: bool,
    span: Span | None = None,
) -> tuple[Any, ...]:
    nulls = d.nulls
    low, high, non_finite = chunk_merge.value_range(d.values) if span is None else span
    return (
        *key,
        d.steps[0],
        d.steps[-1],
        len(d.steps),
        non_finite,
        skipped,
        low,
        high,
        None if nulls and nulls[0] else d.values[0],
        None if nulls and nulls[-1] else d.values[-1],
        t_first,
        t_last,
        chunk_codec.encode(
            key[3] << _SHIFT, d.steps, d.values, nulls, pack or _closed(key, d), d.position
        ),
    )


COLUMNS = (
    *_KEY,
    "first_step",
    "last_step",
    "count",
    "non_finite",
    "skipped",
    "low",
    "high",
    "first",
    "last",
    "time_first",
    "time_last",
    "data",
)
_UPSERT = (
    f"INSERT INTO metric_chunks ({', '.join(COLUMNS)}) VALUES ({{marks}}) "
    f"ON CONFLICT ({', '.join(_KEY)}) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[len(_KEY) :])
)


# SQLite: a rewritten chunk is a new row (REPLACE deletes the old one and appends this one
# with the next rowid), not an update in place. An open chunk grows at every batch and
# shrinks when it closes and is compressed; updated in place, it split its B-tree page as it
# grew and left the page's space to rows that never come (rowids only grow), 6.2 -> 5.5 B a
# step-field value and 10.7 -> 7.3 a layer norm (bench/storage_size.py, 100k / 2,000 steps).
# Appended, the closed chunks fill pages densely and a page that held only open chunks empties
# and returns to the free list, which SQLite reuses for the next pages.
_REPLACE = f"INSERT OR REPLACE INTO metric_chunks ({', '.join(COLUMNS)}) VALUES ({{marks}})"


def upsert(s: Session, rows: list[tuple[Any, ...]]) -> None:
    """Write whole chunks (rows of :data:`COLUMNS`, each key once): one statement on
    PostgreSQL (:func:`~amptrain.store.db.upsert_many`; an executemany cost ~12 us of
    client CPU a chunk), one prepared ``REPLACE`` on SQLite (:data:`_REPLACE`)."""
    sqlite = s.get_bind().dialect.name == "sqlite"
    upsert_many(s, _REPLACE if sqlite else _UPSERT, "metric_chunks", _TYPED, rows)


_TYPED = tuple(
    (
        c,
        "text"
        if c in ("job_id", "kind", "name")
        else "bytea"
        if c == "data"
        else "float8"
        if c in ("low", "high", "first", "last", "time_first", "time_last")
        else "int",
    )
    for c in COLUMNS
)
