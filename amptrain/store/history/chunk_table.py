"""The ``metric_chunks`` table's statements: the stored chunks of a batch's keys read by
primary key, whole chunk rows upserted, and the open rows of chunks that closed deleted
(:mod:`~amptrain.store.history.chunk_writes` decides what the rows hold).

Since migration 0021 ``open`` is part of the key (since 0022 a chunk is open until a newer
chunk of its series and attempt passes it, or its job's telemetry ends:
:mod:`~amptrain.store.history.chunk_writes`). On PostgreSQL the open chunks, rewritten at
every batch, live in partitions of their own, a row a page kept at one size (``slack``),
with no index on a column a rewrite changes, so each rewrite is a HOT update the page
prunes itself; a closed chunk is inserted once into the closed partition, and the next
chunk takes over its open row (:func:`store`). SQLite reuses freed pages itself: its
``REPLACE`` appends each rewritten chunk (:func:`upsert`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.store.db import execute_many, unnested, upsert_many
from amptrain.store.history import chunk_codec
from amptrain.store.history.chunk_codec import CHUNK_STEPS
from amptrain.store.history.chunk_merge import Span, Stored
from amptrain.store.history.chunk_parts import SHIFT as _SHIFT
from amptrain.store.history.chunk_parts import Key


def read(
    s: Session,
    keys: list[Key],
    spans: dict[Key, Span] | None = None,
    opened: set[Key] | None = None,
) -> dict[Key, Stored]:
    """The stored chunks among ``keys``, by primary key: on PostgreSQL one statement for all
    (a join with the unnested keys), on SQLite one per chunk number and attempt. ``spans``,
    when given, also gets each chunk's :data:`Span` as stored; ``opened``, the keys whose
    row is open (None: the table before revision 0021, which has no ``open`` column)."""
    conn: Any = s.connection().connection.driver_connection
    out: dict[Key, Stored] = {}
    if spans is None:
        spans = {}
    flag = "open" if opened is not None else "false"
    if s.get_bind().dialect.name == "sqlite":
        # One statement per chunk number (its names in one IN list): a batch reaches ~15
        # series of a chunk, and a statement's own cost was most of a live batch's read.
        by_chunk: dict[tuple[str, str, int, int], list[str]] = {}
        for job_id, kind, name, chunk, attempt in keys:
            by_chunk.setdefault((job_id, kind, chunk, attempt), []).append(name)
        for (job_id, kind, chunk, attempt), names in by_chunk.items():
            for i in range(0, len(names), _NAMES_PER_READ):
                some = names[i : i + _NAMES_PER_READ]
                sql = _ONE.format(flag=flag, marks=", ".join("?" * len(some)))
                for name, first_time, last_time, data, is_open_, *span in conn.execute(
                    sql, (job_id, kind, chunk, attempt, *some)
                ):
                    key = (job_id, kind, name, chunk, attempt)
                    _take(key, data, first_time, last_time, is_open_, span, out, spans, opened)
        return out
    unnest, columns = unnested(_KEY_TYPED, keys)
    # Binary results: the chunks' bytes as they are, not hex text encoded by the server and
    # decoded here (a third of the read's CPU on each side).
    with conn.cursor(binary=True) as cur:
        for *key, first_time, last_time, data, is_open_, low, high, nf in cur.execute(
            _MANY.format(unnest=unnest, flag="c." + flag if opened is not None else flag), columns
        ):
            got = (key[0], key[1], key[2], key[3], key[4])
            _take(got, data, first_time, last_time, is_open_, (low, high, nf), out, spans, opened)
    return out


def open_chunks(s: Session, job_id: str) -> dict[Key, int]:
    """The job's open chunks (each series' newest of each attempt, PostgreSQL's open
    partitions) and each one's ``skipped``: what :func:`~amptrain.store.history.chunk_writes.seal_job`
    closes when the job's telemetry ends."""
    rows = s.execute(_OPEN_OF_JOB, {"job": job_id})
    return {(j, k, n, int(c), int(a)): int(sk) for j, k, n, c, a, sk in rows}


_OPEN_OF_JOB = sa.text(
    "SELECT job_id, kind, name, chunk, attempt, skipped FROM metric_chunks "
    "WHERE job_id = :job AND open"
)


def passed(s: Session, keys: list[Key]) -> dict[Key, bool]:
    """For each of ``keys`` (chunks not stored yet), the newest stored chunk of its series
    and attempt below it, if any, and whether that one is open: the chunk the new one passes,
    which closes (a series' chunks close in order, so none below it is open). One statement
    on PostgreSQL; one per key on SQLite; each a backward seek of the primary key."""
    if not keys:
        return {}
    if s.get_bind().dialect.name == "sqlite":
        conn: Any = s.connection().connection.driver_connection
        found = [
            row
            for job_id, kind, name, chunk, attempt in keys
            for row in conn.execute(_PASSED_ONE, (job_id, kind, name, attempt, chunk))
        ]
    else:
        conn = s.connection().connection.driver_connection
        with conn.cursor() as cur:
            unnest, columns = unnested(_KEY_TYPED, keys)
            found = list(cur.execute(_PASSED_MANY.format(unnest=unnest), columns))
    return {(j, k, n, int(c), int(a)): bool(o) for j, k, n, c, a, o in found}


_PASSED_ONE = (
    "SELECT job_id, kind, name, chunk, attempt, open FROM metric_chunks WHERE job_id = ? "
    "AND kind = ? AND name = ? AND attempt = ? AND chunk < ? ORDER BY chunk DESC LIMIT 1"
)
_PASSED_MANY = (
    "SELECT c.job_id, c.kind, c.name, c.chunk, c.attempt, c.open "
    "FROM {unnest} AS k(job_id, kind, name, chunk, attempt) CROSS JOIN LATERAL (SELECT m.job_id, m.kind, "
    "m.name, m.chunk, m.attempt, m.open FROM metric_chunks m WHERE m.job_id = k.job_id AND m.kind = k.kind AND m.name = k.name "
    "AND m.attempt = k.attempt AND m.chunk < k.chunk ORDER BY m.chunk DESC LIMIT 1) c"
)


def _take(
    key: Key,
    data: Any,
    first_time: float | None,
    last_time: float | None,
    is_open_: Any,
    span: Sequence[Any],
    out: dict[Key, Stored],
    spans: dict[Key, Span],
    opened: set[Key] | None,
) -> None:
    out[key] = (chunk_codec.decode(key[3] << _SHIFT, bytes(data)), first_time, last_time)
    spans[key] = (span[0], span[1], span[2])
    if opened is not None and is_open_:
        opened.add(key)


_KEY = ("job_id", "kind", "name", "chunk", "attempt")
_KEY_TYPED = tuple((c, "text" if c in ("job_id", "kind", "name") else "int") for c in _KEY)
"""The key's columns as :func:`~amptrain.store.db.unnested` takes them: the keys go as array
literals, not lists psycopg dumps value by value (~0.5 us a value, ~0.6 us a point)."""
_ONE = (
    "SELECT name, time_first, time_last, data, {flag}, low, high, non_finite FROM metric_chunks "
    "WHERE job_id = ? AND kind = ? AND chunk = ? AND attempt = ? AND name IN ({marks})"
)
_NAMES_PER_READ = 500
"""Names per SQLite read at most (a layer-norm record can name a few thousand)."""
_MANY = (
    "SELECT c.job_id, c.kind, c.name, c.chunk, c.attempt, c.time_first, c.time_last, c.data, "
    "{flag}, c.low, c.high, c.non_finite "
    "FROM {unnest} AS k(job_id, kind, name, chunk, attempt) JOIN metric_chunks c ON c.job_id = k.job_id "
    "AND c.kind = k.kind AND c.name = k.name AND c.chunk = k.chunk AND c.attempt = k.attempt"
)


def is_open(chunk: int, last_step: int) -> bool:
    """The chunk's last aligned step is not recorded yet: later batches may add to it. Once
    it is, an attempt (which records its steps in order) adds nothing more (a rare late step
    still can: the chunk is then repacked, and stays closed, as its last step stays).
    Revision 0021's rule for the ``open`` column, which its writer kept (0022's downgrade
    restores it); since 0022 a chunk stays open until a newer one passes it."""
    return last_step != (chunk << _SHIFT) + CHUNK_STEPS - 1


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
    "open",
)


def _upsert(columns: Sequence[str]) -> str:
    return (
        f"INSERT INTO metric_chunks ({', '.join(columns)}) VALUES ({{marks}}) "
        f"ON CONFLICT ({', '.join(k for k in columns if k in _KEYED)}) DO UPDATE SET "
        + ", ".join(f"{c} = excluded.{c}" for c in columns if c not in _KEYED)
    )


_KEYED = (*_KEY, "open")
"""The primary key since revision 0021 (``open`` too: PostgreSQL's partitions)."""


# SQLite: a rewritten chunk is a new row (REPLACE deletes the old one and appends this one
# with the next rowid), not an update in place. An open chunk grows at every batch and
# shrinks when it closes and is compressed; updated in place, it split its B-tree page as it
# grew and left the page's space to rows that never come (rowids only grow), 6.2 -> 5.5 B a
# step-field value and 10.7 -> 7.3 a layer norm (bench/storage_size.py, 100k / 2,000 steps).
# Appended, the closed chunks fill pages densely and a page that held only open chunks empties
# and returns to the free list, which SQLite reuses for the next pages.
def _replace(columns: Sequence[str]) -> str:
    return f"INSERT OR REPLACE INTO metric_chunks ({', '.join(columns)}) VALUES ({{marks}})"


def upsert(s: Session, rows: list[tuple[Any, ...]], columns: Sequence[str] = COLUMNS) -> None:
    """Write whole chunks (rows of ``columns``: :data:`COLUMNS`, or all but ``open`` before
    revision 0021; each key once): one statement on PostgreSQL
    (:func:`~amptrain.store.db.upsert_many`; an executemany cost ~12 us of client CPU a
    chunk), one prepared ``REPLACE`` on SQLite (:func:`_replace`)."""
    sqlite = s.get_bind().dialect.name == "sqlite"
    sql = _STATEMENTS[sqlite, len(columns) == len(COLUMNS)]
    upsert_many(s, sql, "metric_chunks", _TYPED[: len(columns)], rows)


_STATEMENTS = {
    (sqlite, keyed_open): (_replace if sqlite else _upsert)(COLUMNS if keyed_open else COLUMNS[:-1])
    for sqlite in (True, False)
    for keyed_open in (True, False)
}


def store(s: Session, keys: Sequence[Key], rows: list[tuple[Any, ...]], opened: set[Key]) -> None:
    """Write a batch's chunk rows (``keys[i]``'s is ``rows[i]``, of :data:`COLUMNS`) and
    remove the open rows of the chunks that closed (``opened``: the keys stored open).

    On PostgreSQL a series' new open chunk takes over the open row of its chunk that closed
    (:func:`_take_over`) instead of a new row beside a deleted one: a deleted row's page is
    not reused before a vacuum finds it, so each chunk boundary of each series left a page
    behind (256 live layer norms: 18 MiB held for 1 MiB of open rows between vacuums)."""
    closing = [k for k, r in zip(keys, rows, strict=True) if k in opened and not r[-1]]
    if closing and s.get_bind().dialect.name != "sqlite":
        freed: dict[tuple[str, str, str, int], list[Key]] = {}
        for k in closing:
            freed.setdefault((k[0], k[1], k[2], k[4]), []).append(k)
        moves, rest = [], []
        for key, row in zip(keys, rows, strict=True):
            series = freed.get((key[0], key[1], key[2], key[4]))
            if row[-1] and key not in opened and series:
                moves.append((series.pop()[3], *row[:-1]))
            else:
                rest.append(row)
        closing, rows = [k for ks in freed.values() for k in ks], rest
        _take_over(s, moves)
    upsert(s, rows)
    close(s, closing)


def _take_over(s: Session, moves: list[tuple[Any, ...]]) -> None:
    """Rewrite each open row of chunk ``move[0]`` as the row ``move[1:]`` (:data:`COLUMNS`
    but ``open``) of the same series' next chunk: one statement. The key changes, so it is
    no HOT update, but the row keeps its page (room for a version is what the open
    partition's pages keep) and the page prunes the old version when next rewritten."""
    if not moves:
        return
    unnest, data = unnested([("old_chunk", "int"), *_TYPED[:-1]], moves)
    conn: Any = s.connection().connection.driver_connection
    with conn.cursor() as cur:
        cur.execute(_TAKE_OVER.format(unnest=unnest), data)


_TAKE_OVER = (
    "UPDATE metric_chunks c SET "
    + ", ".join(f"{c} = u.{c}" for c in COLUMNS[3:-1])
    + " FROM {unnest} AS u(old_chunk, "
    + ", ".join(COLUMNS[:-1])
    + ") WHERE c.open AND c.job_id = u.job_id AND c.kind = u.kind AND c.name = u.name "
    "AND c.attempt = u.attempt AND c.chunk = u.old_chunk"
)


def close(s: Session, keys: list[Key]) -> None:
    """Delete the open rows of ``keys``, whose closed rows this write inserted: on
    PostgreSQL the two are rows of different partitions (migration 0021), so the upsert
    cannot replace one by the other; on SQLite ``REPLACE`` keys by ``open`` too. One
    statement (PostgreSQL) or one prepared executemany (SQLite)."""
    if not keys:
        return
    if s.get_bind().dialect.name == "sqlite":
        execute_many(s, _CLOSE_ONE, keys)
        return
    conn: Any = s.connection().connection.driver_connection
    with conn.cursor() as cur:
        unnest, columns = unnested(_KEY_TYPED, keys)
        cur.execute(_CLOSE_MANY.format(unnest=unnest), columns)


_CLOSE_ONE = (
    "DELETE FROM metric_chunks WHERE job_id = ? AND kind = ? AND name = ? AND chunk = ? "
    "AND attempt = ? AND open"
)
_CLOSE_MANY = (
    "DELETE FROM metric_chunks c "
    "USING {unnest} AS k(job_id, kind, name, chunk, attempt) WHERE c.open AND c.job_id = k.job_id "
    "AND c.kind = k.kind AND c.name = k.name AND c.chunk = k.chunk AND c.attempt = k.attempt"
)


_TYPED = tuple(
    (
        c,
        "text"
        if c in ("job_id", "kind", "name")
        else "bytea"
        if c == "data"
        else "bool"
        if c == "open"
        else "float8"
        if c in ("low", "high", "first", "last", "time_first", "time_last")
        else "int",
    )
    for c in COLUMNS
)
