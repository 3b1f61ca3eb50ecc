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
primary key, decoded, given the steps they lack (a step already there keeps its first
value, as ``ON CONFLICT DO NOTHING`` did for rows), re-encoded and upserted in one
executemany; a replayed or re-sent range adds no step and writes nothing.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from math import isfinite
from typing import Any

from sqlalchemy.orm import Session

from amptrain.store.history import chunk_codec
from amptrain.store.history.chunk_codec import CHUNK_STEPS, Decoded
from amptrain.store.history.chunk_parts import SHIFT as _SHIFT
from amptrain.store.history.chunk_parts import STEP_KIND as STEP_KIND
from amptrain.store.history.chunk_parts import STEP_SERIES as STEP_SERIES
from amptrain.store.history.chunk_parts import Key, Part, collect


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


Gains = dict[Key, dict[int, tuple[Any, float | None]]]
"""Per chunk the steps a write added to it: step -> (value, None = null; its time)."""


def gather(
    points: Sequence[Mapping[str, Any]], values: Sequence[Mapping[str, Any]]
) -> dict[Key, Part]:
    """The new values of each chunk, from the recorder's points and named values."""
    return collect(points, values)


def write(s: Session, parts: Mapping[Key, Part], pack: bool = False) -> Gains:
    """Merge ``parts`` (:func:`gather`) into their stored chunks and upsert the chunks that
    changed; what each gained (the roll-ups' upkeep reads it)."""
    if not parts:
        return {}
    stored = read(s, list(parts))
    merged, gains = _merge(parts, stored)
    upsert(s, _rows(merged, stored, pack))
    return gains


Stored = tuple[Decoded, float | None, float | None]
"""A stored chunk: its contents and the wall clock of its first and last value (None: a
record that carried no time)."""


def read(s: Session, keys: list[Key]) -> dict[Key, Stored]:
    """The stored chunks among ``keys``, by primary key: on PostgreSQL one statement for all
    (a join with the unnested keys), on SQLite one cached statement per key (no round
    trips to save there)."""
    conn: Any = s.connection().connection.driver_connection
    out: dict[Key, Stored] = {}
    if s.get_bind().dialect.name == "sqlite":
        for key in keys:
            for first_time, last_time, data in conn.execute(_ONE, key):
                out[key] = (chunk_codec.decode(key[3] << _SHIFT, data), first_time, last_time)
        return out
    columns = [list(c) for c in zip(*keys, strict=True)]
    with conn.cursor() as cur:
        for job_id, kind, name, chunk, attempt, first_time, last_time, data in cur.execute(
            _MANY, columns
        ):
            decoded = chunk_codec.decode(chunk << _SHIFT, bytes(data))
            out[(job_id, kind, name, chunk, attempt)] = (decoded, first_time, last_time)
    return out


_KEY = ("job_id", "kind", "name", "chunk", "attempt")
_ONE = (
    "SELECT time_first, time_last, data FROM metric_chunks "
    "WHERE job_id = ? AND kind = ? AND name = ? AND chunk = ? AND attempt = ?"
)
_MANY = (
    "SELECT c.job_id, c.kind, c.name, c.chunk, c.attempt, c.time_first, c.time_last, c.data "
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
    """Every chunk that changes (:func:`_merged`) and the steps each gains."""
    merged: dict[Key, Stored] = {}
    gains: Gains = {}
    for key, part in parts.items():
        m = _merged(part, stored.get(key))
        if m is not None:
            merged[key], new = m
            if new:
                gains[key] = new
    return merged, gains


def _rows(
    merged: Mapping[Key, Stored], stored: Mapping[Key, Stored], pack: bool
) -> list[tuple[Any, ...]]:
    return [_row(key, *m, _skipped(key, merged, stored), pack) for key, m in merged.items()]


def _merged(
    part: Part, old: Stored | None
) -> tuple[Stored, dict[int, tuple[Any, float | None]]] | None:
    """A chunk with the part's new steps, and those steps (step -> value, time); None when
    it gains none (a replay) and no place (a chunk migration 0014 wrote before a name's
    place was kept)."""
    have = set(old[0].steps) if old is not None else set()
    new: dict[int, tuple[Any, float | None]] = {}
    for step, value, at in zip(part.steps, part.values, part.times, strict=True):
        if step not in have and step not in new:
            new[step] = (value, at)
    position = part.position if old is None or old[0].position is None else old[0].position
    if not new and (old is None or old[0].position == position):
        return None
    entries = [(step, v) for step, (v, _) in new.items()]
    t_first = new[min(new)][1] if new else None
    t_last = new[max(new)][1] if new else None
    if old is not None:
        o = old[0]
        nulls = o.nulls or bytes(len(o.steps))
        entries += [
            (step, None if null else v)
            for step, v, null in zip(o.steps, o.values, nulls, strict=True)
        ]
        t_first = old[1] if not new or o.steps[0] < min(new) else t_first
        t_last = old[2] if not new or o.steps[-1] > max(new) else t_last
    entries.sort(key=_first)
    steps = array("q", [e[0] for e in entries])
    try:
        values = array("d", [_NAN if e[1] is None else e[1] for e in entries])
    except (TypeError, OverflowError):
        # Not a number (a malformed entry that took the decoder's generic route): null,
        # rather than a batch that fails at every retry.
        entries = [(step, _number(v)) for step, v in entries]
        values = array("d", [_NAN if e[1] is None else e[1] for e in entries])
    flags = bytes([e[1] is None for e in entries])
    return (Decoded(steps, values, flags if any(flags) else None, position), t_first, t_last), new


_NAN = float("nan")


def _number(v: Any) -> float | None:
    if type(v) not in (int, float, bool):
        return None
    try:
        return float(v)
    except OverflowError:
        return None


def _first(entry: tuple[int, Any]) -> int:
    return entry[0]


def _skipped(key: Key, merged: Mapping[Key, Stored], stored: Mapping[Key, Stored]) -> int:
    """How many of the chunk's steps were skipped: from the same attempt's ``skipped``
    series (written with every step series of a point, so over the same steps)."""
    if key[1] != STEP_KIND:
        return 0
    flag_key = (key[0], STEP_KIND, "skipped", key[3], key[4])
    flags = merged.get(flag_key) or stored.get(flag_key)
    return 0 if flags is None else sum(1 for v in flags[0].values if v == 1)


def _closed(key: Key, d: Decoded) -> bool:
    """The chunk's last aligned step is recorded: an attempt records its steps in order,
    so no later batch adds to it (a rare late one still can: it is then repacked)."""
    return d.steps[-1] == (key[3] << _SHIFT) + CHUNK_STEPS - 1


def _row(
    key: Key, d: Decoded, t_first: float | None, t_last: float | None, skipped: int, pack: bool
) -> tuple[Any, ...]:
    finite = [v for v in d.values if isfinite(v)]
    nulls = d.nulls
    return (
        *key,
        d.steps[0],
        d.steps[-1],
        len(d.steps),
        len(d.steps) - len(finite),
        skipped,
        min(finite) if finite else None,
        max(finite) if finite else None,
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


def upsert(s: Session, rows: list[tuple[Any, ...]]) -> None:
    """Write whole chunks (rows of :data:`COLUMNS`) through one prepared statement."""
    if not rows:
        return
    conn: Any = s.connection().connection.driver_connection
    if s.get_bind().dialect.name == "sqlite":
        conn.executemany(_UPSERT.format(marks=", ".join("?" * len(COLUMNS))), rows)
        return
    with conn.cursor() as cur:
        cur.executemany(_UPSERT.format(marks=", ".join(["%s"] * len(COLUMNS))), rows)
