"""Appending a batch's values to the series' chunks (``metric_chunks``), inside the caller's
transaction: the recorder's batch, or migration 0014 moving old rows.

Which series exist is the metric table's decision: every per-step field of
:data:`~amptrain.contract.metrics.STEP_METRICS` that is a number (:data:`STEP_SERIES`: all
but ``step`` itself, the key, and the per-rank memory list, which stays a JSON column of
``metric_points``) is a ``step`` series; each evaluation metric and each layer's gradient
norm is a series of its kind (:data:`~amptrain.contract.metrics.VALUE_KINDS`).

A value lands in the chunk ``(job, kind, name, step // 256, attempt)``: the key alone says
where it goes, so at-least-once delivery is harmless. The touched chunks are read by
primary key, decoded, given the steps they lack (a step already there keeps its first
value, as ``ON CONFLICT DO NOTHING`` did for rows), re-encoded and upserted in one
executemany; a replayed or re-sent range adds no step and writes nothing.
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from math import isfinite
from typing import Any

from sqlalchemy.orm import Session

from amptrain.contract.metrics import STEP_METRICS
from amptrain.store.history import chunk_codec
from amptrain.store.history.chunk_codec import CHUNK_STEPS, Decoded

STEP_KIND = "step"
"""``metric_chunks.kind`` of the per-step fields (the named series use their own kinds)."""
STEP_SERIES: tuple[str, ...] = tuple(
    m.name for m in STEP_METRICS if m.name != "step" and m.type in ("int", "float", "bool", "bytes")
)
"""The per-step fields stored as series, in the metric table's order."""
_SHIFT = CHUNK_STEPS.bit_length() - 1

Key = tuple[str, str, str, int, int]
"""``(job_id, kind, name, chunk, attempt)``: a chunk's primary key."""


class _Part:
    """New values of one chunk, in arrival order: steps, values (None = null), times."""

    __slots__ = ("steps", "times", "values")

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.values: list[Any] = []
        self.times: list[float | None] = []


def append(
    s: Session,
    points: Sequence[Mapping[str, Any]],
    values: Sequence[Mapping[str, Any]],
    pack: bool = False,
) -> int:
    """Add the points (dicts with ``job_id``, ``attempt``, ``step``, ``time`` and the step
    fields) and the named values (``job_id``, ``attempt``, ``step``, ``kind``, ``name``,
    ``value``, ``time``) to their chunks; the number of chunks written. ``pack``: as for
    :func:`merge`."""
    return len(write(s, gather(points, values), pack))


Gains = dict[Key, dict[int, tuple[Any, float | None]]]
"""Per chunk the steps a write added to it: step -> (value, None = null; its time)."""


def gather(
    points: Sequence[Mapping[str, Any]], values: Sequence[Mapping[str, Any]]
) -> dict[Key, _Part]:
    """The new values of each chunk, from the recorder's points and named values."""
    parts: dict[Key, _Part] = {}
    _points_into(parts, points)
    for v in values:
        step = v["step"]
        key = (v["job_id"], v["kind"], v["name"], step >> _SHIFT, v["attempt"])
        part = parts.get(key)
        if part is None:
            part = parts[key] = _Part()
        part.steps.append(step)
        part.values.append(v["value"])
        part.times.append(v["time"])
    return parts


def write(s: Session, parts: Mapping[Key, _Part], pack: bool = False) -> Gains:
    """Merge ``parts`` (:func:`gather`) into their stored chunks and upsert the chunks that
    gained a step; what each gained (the roll-ups' upkeep reads it)."""
    if not parts:
        return {}
    stored = read(s, list(parts))
    gains = gained(parts, stored)
    upsert(s, _rows(gains, stored, pack))
    return gains


def _points_into(parts: dict[Key, _Part], points: Iterable[Mapping[str, Any]]) -> None:
    groups: dict[tuple[str, int, int], list[Mapping[str, Any]]] = defaultdict(list)
    for p in points:
        groups[(p["job_id"], p["step"] >> _SHIFT, p["attempt"])].append(p)
    for (job_id, chunk, attempt), group in groups.items():
        steps = [p["step"] for p in group]
        times = [p["time"] for p in group]
        for name in STEP_SERIES:
            part = parts[(job_id, STEP_KIND, name, chunk, attempt)] = _Part()
            part.steps, part.times = steps, times
            part.values = [p.get(name) for p in group]


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
    parts: Mapping[Key, _Part], stored: Mapping[Key, Stored], pack: bool = False
) -> list[tuple[Any, ...]]:
    """The rows (:data:`COLUMNS`) of every chunk that gains a step; a step already stored
    (or repeated in ``parts``) keeps its first value. ``pack``: compress every chunk, open
    or not (the migration's, whose chunks will not grow)."""
    return _rows(gained(parts, stored), stored, pack)


def gained(parts: Mapping[Key, _Part], stored: Mapping[Key, Stored]) -> Gains:
    """The steps each chunk gains: those of ``parts`` not stored (nor repeated before)."""
    gains: Gains = {}
    for key, part in parts.items():
        old = stored.get(key)
        have = set(old[0].steps) if old is not None else set()
        new: dict[int, tuple[Any, float | None]] = {}
        for step, value, at in zip(part.steps, part.values, part.times, strict=True):
            if step not in have and step not in new:
                new[step] = (value, at)
        if new:  # else a replay: nothing new
            gains[key] = new
    return gains


def _rows(gains: Gains, stored: Mapping[Key, Stored], pack: bool) -> list[tuple[Any, ...]]:
    merged: dict[Key, Stored] = {}
    for key, new in gains.items():
        old = stored.get(key)
        first, last = min(new), max(new)
        t_first, t_last = new[first][1], new[last][1]
        entries = [(step, v) for step, (v, _) in new.items()]
        if old is not None:
            o = old[0]
            nulls = o.nulls or bytes(len(o.steps))
            entries += [
                (step, None if null else v)
                for step, v, null in zip(o.steps, o.values, nulls, strict=True)
            ]
            t_first = old[1] if o.steps[0] < first else t_first
            t_last = old[2] if o.steps[-1] > last else t_last
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
        merged[key] = (Decoded(steps, values, flags if any(flags) else None), t_first, t_last)
    return [_row(key, *m, _skipped(key, merged, stored), pack) for key, m in merged.items()]


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
        chunk_codec.encode(key[3] << _SHIFT, d.steps, d.values, nulls, pack or _closed(key, d)),
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
