"""Roll-ups of the chunks (``metric_rollups``): per series, attempt and aligned block of
chunks, what a downsampled read needs per bucket (count, first/last step, non-finite,
skipped and flagged counts, the first flagged step, the lowest and highest finite value and
the first step holding each), so a read of a 10M-step run visits a few hundred rows.

Levels (:data:`LEVELS`): 0 is one chunk (256 steps), 4 sixteen chunks (4,096 steps), 8
256 chunks (65,536 steps); ``idx = chunk >> level``. Each is kept by the recorder in the
batch's transaction from what the batch ADDED to the chunks
(:func:`~amptrain.store.history.chunk_writes.write`): a chunk only gains steps, so a
roll-up is the old one combined with the new steps' aggregates, and a replay, which adds
nothing, changes nothing. The step kind's blocks keep their notable steps' records with
them (:mod:`amptrain.store.history.exemplars`). :mod:`amptrain.store.history.rollup_rebuild` builds them from
existing chunks (migration 0016, bulk-loaded benchmarks).

A step is *flagged* (step series only) as :func:`step_flags` says: skipped, or its loss
null/NaN/infinite, or its grad norm NaN/infinite (not null).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import isfinite
from operator import itemgetter
from typing import Any

from sqlalchemy.orm import Session

from amptrain.store.db import unnested, upsert_many
from amptrain.store.history import chunk_writes, exemplars
from amptrain.store.history.block_stats import Row, gained_blocks, part_blocks
from amptrain.store.history.chunk_merge import Gained, number
from amptrain.store.history.chunk_parts import Key, Part, rolled_up
from amptrain.store.history.chunk_writes import STEP_KIND, Gains
from amptrain.store.history.point_columns import PointColumns
from amptrain.store.history.rollup_stats import STATS as STATS
from amptrain.store.history.rollup_stats import Stats as Stats

LEVELS = (0, 4, 8)
"""Roll-up levels, in chunks: 1, 16 and 256 chunks (256, 4,096 and 65,536 steps)."""
FLAG_SERIES = ("loss", "grad_norm", "skipped")
"""The step series whose values decide whether a step is flagged."""
RKey = tuple[str, str, str, int, int, int]
"""``(job_id, kind, name, level, idx, attempt)``: a roll-up's primary key."""
_KEY = ("job_id", "kind", "name", "level", "idx", "attempt")

COLUMNS = (*_KEY, *STATS)


def record(
    s: Session,
    points: Sequence[Mapping[str, Any]],
    values: Sequence[Mapping[str, Any]],
    columns: Sequence[PointColumns] = (),
    last: dict[Key, int] | None = None,
) -> Gains:
    """The recorder's write of a batch's points (as rows, and as ``columns``) and named
    values into their chunks (:func:`chunk_writes.gather`) and the chunks' roll-ups, in the
    caller's transaction; what the chunks gained (what is new in the batch: a replay gains
    nothing). ``last``: as for :func:`chunk_writes.write`."""
    parts = chunk_writes.gather(points, values, columns)
    blocks = part_blocks(parts, rolled_up)
    gains = chunk_writes.write(s, parts, last=last, blocks=blocks)
    keep(s, gains, parts, blocks)
    return gains


def keep(
    s: Session,
    gains: Gains,
    parts: Mapping[Key, Part] | None = None,
    blocks: Mapping[Key, Row] | None = None,
) -> None:
    """Fold what a write added to the chunks (:func:`chunk_writes.write`) into every level's
    roll-ups, read and upserted by primary key in the caller's transaction; ``parts``: what
    the write was given (a chunk's step series that gained their whole parts are
    aggregated together: :func:`~amptrain.store.history.block_stats.gained_blocks`);
    ``blocks``: those parts' aggregates when already taken (else taken here)."""
    deltas: dict[RKey, Stats] = {}
    flags = _flags(gains)
    if parts and blocks is None:
        blocks = part_blocks(parts, rolled_up)
    blocks = gained_blocks(gains, parts, blocks) if parts and blocks else {}
    for key5, new in gains.items():
        job_id, kind, name, chunk, attempt = key5
        if not rolled_up(kind, name):
            continue
        marks = flags.get((job_id, chunk, attempt)) if kind == STEP_KIND else None
        block = blocks.get(key5)
        delta = gained_stats(new, marks) if block is None else _marked(Stats(block), marks)
        for level in LEVELS:
            key = (job_id, kind, name, level, chunk >> level, attempt)
            have = deltas.get(key)
            if have is None:
                # a chunk's level-0 roll-up gains only this delta: it is the delta itself
                deltas[key] = have = Stats() if level else delta
                if not level:
                    continue
            have.merge(delta)
    totals = read(s, list(deltas)) if deltas else {}
    for key, delta in deltas.items():
        total = totals.get(key)
        if total is None:
            totals[key] = delta  # none stored: the batch's aggregates are the total
        else:
            total.merge(delta)
    upsert(s, [(*key, *totals[key].row()) for key in deltas])
    exemplars.keep(s, totals, gains, LEVELS)


Marks = tuple[set[int], set[int]]
"""The skipped and the flagged steps among a chunk's new steps (step series)."""
_INF = float("inf")


def gained_stats(new: Gained, marks: Marks | None) -> Stats:
    """The aggregates of a chunk's new steps (in any order) in a few passes of builtins
    over the batch, not a method call per value (12.6 us a point before); ties go to the
    earliest step, as :meth:`Stats.merge` and the rebuild's numpy pass have them."""
    out = Stats()
    if not new:
        return out
    steps = list(new)
    values = _finite_numbers(new)
    out.count = len(steps)
    if values is not None and steps == sorted(steps):
        # the common batch: ascending steps, all numbers and finite; min, max and index
        # take the first of ties, the earliest step
        out.first_step, out.last_step = steps[0], steps[-1]
        out.low = min(values)
        out.low_step = steps[values.index(out.low)]
        out.high = max(values)
        out.high_step = steps[values.index(out.high)]
    else:
        raw = list(new.values())
        if raw.count(None) == out.count:  # a field the run does not record (memory on a CPU)
            out.first_step, out.last_step, out.non_finite = min(steps), max(steps), out.count
        else:
            _any_order(out, steps, list(map(number, raw)))
    if marks is not None and marks[1]:  # (the skipped steps are flagged too)
        skipped, flagged = marks
        out.skipped = len(skipped.intersection(steps))
        hit = flagged.intersection(steps)
        out.flagged = len(hit)
        out.first_flag = min(hit) if hit else None
    return out


def _marked(out: Stats, marks: Marks | None) -> Stats:
    """``out``, the aggregates of new steps that hold every step the marks name (a block of
    a chunk's points), with the marks' counts."""
    if marks is not None and marks[1]:  # (the skipped steps are flagged too)
        out.skipped, out.flagged, out.first_flag = len(marks[0]), len(marks[1]), min(marks[1])
    return out


def _any_order(out: Stats, steps: list[int], values: list[float | None]) -> None:
    out.first_step, out.last_step = min(steps), max(steps)
    # NaN fails both comparisons: finite values only
    held = [
        (v, st) for v, st in zip(values, steps, strict=True) if v is not None and -_INF < v < _INF
    ]
    out.non_finite = out.count - len(held)
    if held:
        out.low, out.low_step = min(held)  # the lowest value, then the earliest step
        top = max(v for v, _ in held)  # the highest value, then the earliest step
        out.high, out.high_step = min(((v, st) for v, st in held if v == top), key=_SECOND)


_SECOND = itemgetter(1)
_NUMBERS = frozenset((float, int, bool))


def _finite_numbers(new: Gained) -> list[float] | None:
    """The new values as floats when every one is a finite number (a sum of finite floats
    is finite unless it overflows, and a NaN or infinity makes it so); else None."""
    raw = list(new.values())
    if not _NUMBERS.issuperset(map(type, raw)):
        return None
    try:
        values = list(map(float, raw))
    except OverflowError:
        return None
    return values if isfinite(sum(values)) else None


def _flags(gains: Gains) -> dict[tuple[str, int, int], Marks]:
    """Per (job, chunk, attempt) of the step series written, the skipped and the flagged
    steps among its new loss steps (skipped: ``skipped`` is 1; flagged: skipped, or a null
    or non-finite loss, or a NaN or infinite grad norm): a point brings every step series at
    once, so they gain the same steps. A series of finite numbers flags nothing."""
    out: dict[tuple[str, int, int], Marks] = {}
    for (job_id, kind, name, chunk, attempt), new in gains.items():
        if kind != STEP_KIND or name != "loss":
            continue
        norms = gains.get((job_id, kind, "grad_norm", chunk, attempt), {})
        skips = gains.get((job_id, kind, "skipped", chunk, attempt), {})
        skipped: set[int] = set()
        if 1 in skips.values():  # == 1: True, 1 and 1.0, as number(v) == 1
            skipped = {st for st, v in skips.items() if st in new and number(v) == 1}
        flagged = set(skipped)
        if _finite_numbers(new) is None:
            flagged.update(
                st for st, v in new.items() if (x := number(v)) is None or not isfinite(x)
            )
        if norms and _finite_numbers(norms) is None:
            flagged.update(
                st
                for st, v in norms.items()
                if st in new and (x := number(v)) is not None and not isfinite(x)
            )
        out[(job_id, chunk, attempt)] = (skipped, flagged)
    return out


_ONE = f"SELECT {', '.join(STATS)} FROM metric_rollups WHERE " + " AND ".join(
    f"{c} = ?" for c in _KEY
)
_MANY = (
    f"SELECT {', '.join('r.' + c for c in COLUMNS)} FROM {{unnest}} AS k(job_id, kind, name, level, idx, attempt) "
    "JOIN metric_rollups r ON " + " AND ".join(f"r.{c} = k.{c}" for c in _KEY)
)
_UPSERT = (
    f"INSERT INTO metric_rollups ({', '.join(COLUMNS)}) VALUES ({{marks}}) "
    f"ON CONFLICT ({', '.join(_KEY)}) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in STATS)
)


def read(s: Session, keys: list[RKey]) -> dict[RKey, Stats]:
    """The stored roll-ups among ``keys``: on PostgreSQL one statement (a join with the
    unnested keys), on SQLite one cached statement per key (no round trips to save)."""
    conn: Any = s.connection().connection.driver_connection
    out: dict[RKey, Stats] = {}
    if s.get_bind().dialect.name == "sqlite":
        for key in keys:
            for row in conn.execute(_ONE, key):
                out[key] = Stats(row)
        return out
    # the keys as array literals (psycopg dumps a list value by value: ~0.5 us a value)
    unnest, columns = unnested(_TYPED[: len(_KEY)], keys)
    with conn.cursor() as cur:
        for row in cur.execute(_MANY.format(unnest=unnest), columns):
            out[tuple(row[: len(_KEY)])] = Stats(row[len(_KEY) :])
    return out


def upsert(s: Session, rows: list[tuple[Any, ...]]) -> None:
    """Write whole roll-ups (rows of :data:`COLUMNS`, each key once) in one statement."""
    upsert_many(s, _UPSERT, "metric_rollups", _TYPED, rows)


_TYPED = tuple(
    (c, "text" if c in ("job_id", "kind", "name") else "float8" if c in ("low", "high") else "int")
    for c in COLUMNS
)
