"""A series' values from its chunks, newest step first, without numpy: the readers that run in
the recorder's batch transaction (alert windows, the summary's steady rate) and the small
reads beside them (the comparison report's numbers, the stall watch).

A walk goes down the series' chunk numbers through the primary key (job, kind, name, chunk,
attempt), a few chunks per statement (doubling), so its cost follows the values it takes,
not the run's length, and no plan depends on planner statistics. Decoding is
:func:`~amptrain.store.history.chunk_codec.decode` (standard-library arrays).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from math import isfinite
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.store.history import chunk_codec
from amptrain.store.history.chunk_parts import MS, SHIFT, STEP_KIND

Value = float | None
"""A stored value: None where it was recorded null (a NaN stays a NaN)."""
Row = tuple[int, tuple[Value, ...]]
"""A step and the values of the names asked for at it (None where a name has none)."""

FIRST_BATCH = 2
"""Chunks of the first statement of a walk (a window's tail usually sits in one or two)."""
MAX_BATCH = 64


def newest_first(
    s: Session,
    job_id: str,
    kind: str,
    names: Sequence[str],
    attempt: int | None = None,
    before: int | None = None,
) -> Iterator[Row]:
    """The steps of ``names[0]`` below ``before``, newest first, with every name's value at
    them: of one ``attempt``, or (None) the effective series, per step the newest attempt's
    record (the other names are read from the attempt that won the step)."""
    top = (before - 1) >> SHIFT if before is not None else None
    batch = FIRST_BATCH
    while top is None or top >= 0:
        rows = _chunks_below(s, job_id, kind, names[0], attempt, top, batch)
        if not rows:
            return
        full, lowest = len(rows) == batch, rows[-1][0]
        if attempt is None and full:
            # The batch may have cut the lowest chunk's attempts short: read them all.
            rows = [r for r in rows if r[0] != lowest]
            rows += _chunk(s, job_id, kind, names[0], lowest)
        others = _others(s, job_id, kind, names[1:], {r[0] for r in rows}, attempt)
        for chunk in sorted({r[0] for r in rows}, reverse=True):
            yield from _rows(chunk, [r for r in rows if r[0] == chunk], others, names, before)
        if not full:
            return  # the series' first chunk
        top, batch = lowest - 1, min(batch * 2, MAX_BATCH)


Want = tuple[str, str, str, int, int, int]
"""``(job_id, kind, name, attempt, before, count)``: a window of one attempt's series."""


def windows(s: Session, wants: Sequence[Want]) -> list[list[tuple[int, Value]]]:
    """Per want, its ``count`` newest (step, value) of the attempt's series below ``before``,
    newest first. One statement (a UNION ALL of one primary-key range per want, its first
    :data:`FIRST_BATCH` chunks) answers the usual window; a longer one walks on alone."""
    if not wants:
        return []
    parts: list[str] = []
    params: dict[str, Any] = {}
    for i, (job_id, kind, name, attempt, before, _) in enumerate(wants):
        top = (before - 1) >> SHIFT
        params |= {f"j{i}": job_id, f"k{i}": kind, f"n{i}": name, f"a{i}": attempt, f"t{i}": top}
        parts.append(
            f"SELECT * FROM (SELECT {i} AS part, chunk, attempt, data FROM metric_chunks"
            f" WHERE job_id = :j{i} AND kind = :k{i} AND name = :n{i} AND chunk <= :t{i}"
            f" AND attempt = :a{i} ORDER BY chunk DESC LIMIT {FIRST_BATCH}) AS p{i}"
        )
    found: list[list[tuple[int, int, Any]]] = [[] for _ in wants]
    for part, chunk, attempt, data in s.execute(sa.text(" UNION ALL ".join(parts)), params):
        found[part].append((int(chunk), int(attempt), data))
    out = []
    for (job_id, kind, name, attempt, before, count), rows in zip(wants, found, strict=True):
        got = [
            (step, v)
            for row in sorted(rows, reverse=True)
            for step, (v,) in _rows(row[0], [row], {}, [name], before)
        ][:count]
        if len(got) < count and len(rows) == FIRST_BATCH:  # more chunks below these
            below = min(r[0] for r in rows) << SHIFT
            rest = newest_first(s, job_id, kind, (name,), attempt, below)
            got += [(step, v) for step, (v,) in islice(rest, count - len(got))]
        out.append(got)
    return out


def _rows(
    chunk: int,
    found: list[tuple[int, int, bytes]],
    others: dict[tuple[str, int, int], dict[int, Value]],
    names: Sequence[str],
    before: int | None,
) -> Iterator[Row]:
    """One chunk number's rows (every attempt's, or one), newest step first."""
    won: dict[int, tuple[int, Value]] = {}  # step -> (attempt, value)
    for _, attempt, data in sorted(found, key=lambda r: r[1]):
        for step, value in _values(chunk, data).items():
            won[step] = (attempt, value)  # a newer attempt's record replaces the step's
    for step in sorted(won, reverse=True):
        if before is not None and step >= before:
            continue
        attempt, value = won[step]
        rest = tuple(others.get((n, chunk, attempt), {}).get(step) for n in names[1:])
        yield step, (value, *rest)


def _values(chunk: int, data: Any) -> dict[int, Value]:
    d = chunk_codec.decode(chunk << SHIFT, bytes(data))
    nulls = d.nulls or bytes(len(d.steps))
    return {
        step: None if null else value
        for step, value, null in zip(d.steps, d.values, nulls, strict=True)
    }


def _chunks_below(
    s: Session, job_id: str, kind: str, name: str, attempt: int | None, top: int | None, n: int
) -> list[tuple[int, int, bytes]]:
    """(chunk, attempt, data) of the ``n`` highest chunk rows of the series at or below
    ``top``: one backward range of the primary key."""
    sql = _BELOW[(attempt is None, top is None)]
    params = {"job": job_id, "kind": kind, "name": name, "a": attempt, "top": top, "n": n}
    return [(int(c), int(a), d) for c, a, d in s.execute(sql, params)]


def _below(every_attempt: bool, from_end: bool) -> sa.TextClause:
    one = "" if every_attempt else " AND attempt = :a"
    below = "" if from_end else " AND chunk <= :top"
    return sa.text(
        "SELECT chunk, attempt, data FROM metric_chunks WHERE job_id = :job AND kind = :kind "
        f"AND name = :name{below}{one} ORDER BY chunk DESC, attempt DESC LIMIT :n"
    )


_BELOW = {(e, f): _below(e, f) for e in (True, False) for f in (True, False)}
_CHUNK = sa.text(
    "SELECT chunk, attempt, data FROM metric_chunks WHERE job_id = :job AND kind = :kind "
    "AND name = :name AND chunk = :chunk"
)


def _chunk(
    s: Session, job_id: str, kind: str, name: str, chunk: int
) -> list[tuple[int, int, bytes]]:
    params = {"job": job_id, "kind": kind, "name": name, "chunk": chunk}
    return [(int(c), int(a), d) for c, a, d in s.execute(_CHUNK, params)]


def _others(
    s: Session,
    job_id: str,
    kind: str,
    names: Sequence[str],
    chunks: set[int],
    attempt: int | None,
) -> dict[tuple[str, int, int], dict[int, Value]]:
    """The other names' chunks at those chunk numbers, by (name, chunk, attempt): per name
    one range of the primary key from the lowest chunk number to the highest (an ``IN``
    list of chunk numbers is left to a filter by a planner without statistics)."""
    out = {}
    for name in names if chunks else ():
        params = {"job": job_id, "kind": kind, "name": name, "lo": min(chunks), "hi": max(chunks)}
        for chunk, a, data in s.execute(_OTHERS, params):
            if int(chunk) in chunks and (attempt is None or a == attempt):
                out[(name, int(chunk), int(a))] = _values(int(chunk), data)
    return out


_OTHERS = sa.text(
    "SELECT chunk, attempt, data FROM metric_chunks WHERE job_id = :job AND kind = :kind "
    "AND name = :name AND chunk >= :lo AND chunk <= :hi"
)


def effective_series(s: Session, job_id: str, kind: str, name: str) -> list[tuple[int, Value]]:
    """The whole effective series (per step the newest attempt's value), oldest step first,
    a value that is not finite as None: one range of the primary key (a walk's batches
    would cost a statement per few chunks of a sparse series, an evaluation every thousand
    steps). A chunk of one value is read from its columns, not decoded."""
    by_chunk: dict[int, list[tuple[int, int, Any]]] = {}
    single: dict[int, tuple[int, Value]] = {}
    params = {"job": job_id, "kind": kind, "name": name}
    for chunk, attempt, count, step, first, data in s.execute(_SERIES, params):
        by_chunk.setdefault(int(chunk), []).append((int(chunk), int(attempt), data))
        if count == 1:
            single[int(chunk)] = (int(step), first)
    out: list[tuple[int, Value]] = []
    for chunk, rows in by_chunk.items():
        if len(rows) == 1 and chunk in single:
            out.append(single[chunk])
            continue
        if any(data is None for *_, data in rows):  # a single value among several attempts'
            rows = _chunk(s, job_id, kind, name, chunk)
        out += [(step, v) for step, (v,) in _rows(chunk, rows, {}, [name], None)][::-1]
    return [(step, v if v is not None and isfinite(v) else None) for step, v in out]


_SERIES = sa.text(
    "SELECT chunk, attempt, count, first_step, first, CASE WHEN count > 1 THEN data END "
    "FROM metric_chunks WHERE job_id = :job AND kind = :kind AND name = :name "
    "ORDER BY chunk, attempt"
)


def effective_extent(s: Session, job_id: str, kind: str, name: str) -> tuple[int, Value]:
    """The effective series' number of steps and its highest finite value (None: none is
    finite), from the chunks' counts and highs; only a chunk number that several attempts
    recorded is decoded (to tell which steps the newer one re-recorded)."""
    by_chunk: dict[int, list[tuple[int, float | None]]] = {}
    for chunk, count, high in s.execute(_EXTENT, {"job": job_id, "kind": kind, "name": name}):
        by_chunk.setdefault(int(chunk), []).append((int(count), high))
    steps, highs = 0, []
    for chunk, found in by_chunk.items():
        if len(found) > 1:
            rows = _chunk(s, job_id, kind, name, chunk)
            values = [v for _, (v,) in _rows(chunk, rows, {}, [name], None)]
            finite = [v for v in values if v is not None and isfinite(v)]
            found = [(len(values), max(finite) if finite else None)]
        count, high = found[0]
        steps += count
        highs += [high] if high is not None else []
    return steps, max(highs) if highs else None


_EXTENT = sa.text(
    "SELECT chunk, count, high FROM metric_chunks WHERE job_id = :job AND kind = :kind "
    "AND name = :name"
)


def newest_ms(s: Session, job_id: str, attempt: int) -> int | None:
    """The stream millisecond of the attempt's newest recorded step (None before one): one
    seek of the record-order index (``ix_metric_chunks_record_order``)."""
    found = s.scalar(_NEWEST_MS, {"job": job_id, "kind": STEP_KIND, "attempt": attempt})
    return int(found) if found is not None else None


_NEWEST_MS = sa.text(
    "SELECT high FROM metric_chunks WHERE job_id = :job AND kind = :kind "
    f"AND name = '{MS}' AND attempt = :attempt "  # a literal: the partial index's predicate
    # Not max(high): PostgreSQL then read the attempt's whole index range (2 ms at 1M steps).
    "ORDER BY high DESC LIMIT 1"
)
