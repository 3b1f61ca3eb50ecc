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
from itertools import islice
from math import isfinite
from operator import lt as _lt
from typing import Any

from sqlalchemy.orm import Session

from amptrain.store.history import chunk_codec
from amptrain.store.history.chunk_codec import CHUNK_STEPS, Decoded, Steps
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
    (migration 0015 writes only the reserved ones)."""
    parts = collect(points, values, step_fields)
    if not parts:
        return 0
    rows = merge(parts, read(s, list(parts)), pack)
    upsert(s, rows)
    return len(rows)


Stored = tuple[Decoded, float | None, float | None]
"""A stored chunk: its contents and the wall clock of its first and last value (None: a
record that carried no time)."""


def read(s: Session, keys: list[Key]) -> dict[Key, Stored]:
    """The stored chunks among ``keys``, by primary key: on PostgreSQL one statement for all
    (a join with the unnested keys), on SQLite one per chunk number and attempt."""
    conn: Any = s.connection().connection.driver_connection
    out: dict[Key, Stored] = {}
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
                for name, first_time, last_time, data in conn.execute(
                    sql, (job_id, kind, chunk, attempt, *some)
                ):
                    decoded = chunk_codec.decode(chunk << _SHIFT, data)
                    out[(job_id, kind, name, chunk, attempt)] = (decoded, first_time, last_time)
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
    "SELECT name, time_first, time_last, data FROM metric_chunks "
    "WHERE job_id = ? AND kind = ? AND chunk = ? AND attempt = ? AND name IN ({marks})"
)
_NAMES_PER_READ = 500
"""Names per SQLite read at most (a layer-norm record can name a few thousand)."""
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
    merged: dict[Key, Stored] = {}
    for key, part in parts.items():
        old = stored.get(key)
        m = _appended(part, old)
        if m is None:
            m = _merged(part, old)
        if m is not None:
            merged[key] = m
    skipped: dict[Key, int] = {}
    return [
        _row(key, *m, _skipped(key, merged, stored, skipped), pack) for key, m in merged.items()
    ]


def _appended(part: Part, old: Stored | None) -> Stored | None:
    """The common case without per-value work: the part's steps rise strictly, all after the
    stored chunk's last (an attempt records its steps in order), and every value is a
    number. None otherwise (a replay, a resent range, a null): :func:`_merged` decides."""
    steps = part.steps
    if old is not None and old[0].steps and old[0].steps[-1] >= steps[0]:
        return None
    if not all(map(_lt, steps, islice(steps, 1, None))):
        return None
    got = _numbers(part.values)
    if got is None:
        return None
    values, new_nulls = got
    if old is None:
        decoded = Decoded(_extended(range(0), steps), values, new_nulls, part.position)
        return decoded, part.times[0], part.times[-1]
    o = old[0]
    nulls = None
    if o.nulls or new_nulls:
        nulls = (o.nulls or bytes(len(o.steps))) + (new_nulls or bytes(len(steps)))
    position = part.position if o.position is None else o.position
    decoded = Decoded(_extended(o.steps, steps), o.values + values, nulls, position)
    return decoded, old[1], part.times[-1]


def _extended(old: Steps, new: list[int]) -> Steps:
    """``old`` followed by ``new`` (rising, after it): a range while both are consecutive
    (a range ``old`` is; an array may have gaps)."""
    consecutive = isinstance(old, range) and (not old or old[-1] + 1 == new[0])
    if consecutive and new[-1] - new[0] + 1 == len(new):
        return range(old[0] if old else new[0], new[-1] + 1)
    steps = array("q", old)
    steps.extend(new)
    return steps


def _numbers(raw: list[Any]) -> tuple[array[float], bytes | None] | None:
    """The values as float64 (NaN where null) and their null flags (None: no null); None
    when one is not a number (a malformed entry: :func:`_merged` makes it null)."""
    try:
        return array("d", raw), None
    except (TypeError, OverflowError):
        pass
    nulls = raw.count(None)
    if nulls == len(raw):  # a field this run does not record (memory on a CPU)
        return array("d", [_NAN]) * nulls, b"\x01" * nulls
    try:
        values = array("d", [_NAN if v is None else v for v in raw])
    except (TypeError, OverflowError):
        return None
    return values, bytes([v is None for v in raw]) if nulls else None


def _merged(part: Part, old: Stored | None) -> Stored | None:
    """A chunk with the part's new steps; None when it gains none (a replay) and no place
    (a chunk migration 0014 wrote before a name's place was kept)."""
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
    return Decoded(steps, values, flags if any(flags) else None, position), t_first, t_last


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
    key: Key, d: Decoded, t_first: float | None, t_last: float | None, skipped: int, pack: bool
) -> tuple[Any, ...]:
    nulls = d.nulls
    low, high, non_finite = _range(d.values)
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


def _range(values: array[float]) -> tuple[float | None, float | None, int]:
    """The lowest and highest finite value (None: none is) and how many are not finite
    (NaN, a null, an infinity). A finite sum means every value is finite: then min and max
    are two loops in C, not a list of the finite ones."""
    if isfinite(sum(values)):
        return min(values), max(values), 0
    finite = list(filter(isfinite, values))
    if not finite:
        return None, None, len(values)
    return min(finite), max(finite), len(values) - len(finite)


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
