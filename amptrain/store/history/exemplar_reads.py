"""A downsampled window's chosen points (:func:`window_at`): from the exemplars
(:mod:`amptrain.store.history.exemplars`) where a chosen step lies in a whole roll-up
block of one attempt, from the chunks (:func:`~amptrain.store.history.chunk_pages.window_at`'s
read) where it lies in a bucket's cut edge, a contested chunk (attempts overlap:
:mod:`amptrain.store.history.chunk_cover`) or a block without its record.

A bucket's aggregates are its cover's pieces merged (:mod:`~amptrain.store.history.chunk_stats`),
so a step chosen from a whole block is one of that block's notable steps, and the block's
attempt alone holds it: its exemplar record IS the effective point. Both kinds of records
become one :class:`~amptrain.store.history.chunk_reads.Records` and the items come from
:func:`~amptrain.store.history.chunk_pages.window_items`, the same bytes as before. A
10M-step run's 1,000 points cost one statement for a few hundred blobs, not one chunk
lookup per point and series (13,000).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy
from sqlalchemy.orm import Session

from amptrain.store.history import chunk_reads
from amptrain.store.history.chunk_cover import Node, Raw, Run, pieces
from amptrain.store.history.chunk_pages import point_series, window_items
from amptrain.store.history.chunk_parts import MS, SEQ, SHIFT, STEP_KIND
from amptrain.store.history.chunk_reads import Records
from amptrain.store.history.exemplars import NULL as _NULL
from amptrain.store.history.exemplars import raw_at
from amptrain.store.history.window import runs as consecutive

_I64 = numpy.int64


def window_at(
    s: Session,
    job_id: str,
    runs: list[Run],
    ranges: list[tuple[int, int]],
    steps: Sequence[int],
    fields: Sequence[str] | None,
) -> list[dict[str, Any]]:
    """The effective points at ``steps`` (sorted; each in one of the buckets ``ranges``,
    sorted, covered through ``runs``) as a downsampled window's items, in step order."""
    homes = _homes(runs, ranges, steps)
    wanted: dict[Node, list[int]] = defaultdict(list)
    for step, node in homes.items():
        wanted[node].append(step)
    found: dict[int, Found] = {}
    for node, data in _blobs(s, job_id, list(wanted)).items():
        layout, records = raw_at(data, wanted[node])
        for step, states, values in records:  # each holds its cursor (see exemplars.encode)
            found[step] = (node.attempt, layout, states, values)
    names = point_series(fields)
    held = [] if not found else [_records(found, [n for n in names if n not in (MS, SEQ)])]
    rest = [x for x in steps if x not in found]
    if rest or not held:
        held.append(chunk_reads.by_steps(s, job_id, STEP_KIND, rest, names, effective=True))
    rec = held[0] if len(held) == 1 else _joined(held)
    return window_items(rec.take(numpy.argsort(rec.steps, kind="stable")), fields, True)


def _homes(runs: list[Run], ranges: list[tuple[int, int]], steps: Sequence[int]) -> dict[int, Node]:
    """Per chosen step lying in a whole block of its bucket's cover: that block."""
    starts = [a for a, _ in ranges]
    by_bucket: dict[int, list[int]] = defaultdict(list)
    for step in steps:
        k = bisect_right(starts, step) - 1
        if k >= 0 and step <= ranges[k][1]:
            by_bucket[k].append(step)
    out: dict[int, Node] = {}
    for k, held in by_bucket.items():
        cover = pieces(runs, *ranges[k])
        firsts = [_first(p) for p in cover]
        for step in held:
            i = bisect_right(firsts, step) - 1
            piece = cover[i] if i >= 0 else None
            if isinstance(piece, Node) and step <= _last(piece):
                out[step] = piece
    return out


def _first(p: Node | Raw) -> int:
    return p.first if isinstance(p, Raw) else (p.idx << p.level) << SHIFT


def _last(p: Node) -> int:
    return (((p.idx + 1) << p.level) << SHIFT) - 1


Found = tuple[int, tuple[str, ...], bytes, tuple[float, ...]]
"""An exemplar record read: its attempt, its blob's names, its states and values
(:data:`~amptrain.store.history.exemplars.Raw`)."""


def _records(found: dict[int, Found], names: list[str]) -> Records:
    """The exemplar records as :func:`~amptrain.store.history.chunk_reads.assemble` gives
    the chunks' (NaN where null or not held), in step order: array work per blob layout
    (the names a blob holds; nearly always one layout), not per value."""
    steps = sorted(found)
    columns = [MS, SEQ, "time", *names]
    n = len(steps)
    values = numpy.full((n, len(columns)), numpy.nan)
    states = numpy.zeros((n, len(columns)), numpy.uint8)
    layouts: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for row, step in enumerate(steps):
        layouts[found[step][1]].append(row)
    for layout, rows in layouts.items():
        place = {name: j for j, name in enumerate(layout)}
        pairs = [(c, place[name]) for c, name in enumerate(columns) if name in place]
        targets, at = [c for c, _ in pairs], [j for _, j in pairs]
        got = numpy.array([found[steps[r]][3] for r in rows], numpy.float64).reshape(len(rows), -1)
        held = numpy.frombuffer(b"".join(found[steps[r]][2] for r in rows), numpy.uint8)
        held = held.reshape(len(rows), -1)
        values[numpy.ix_(rows, targets)] = got[:, at]
        states[numpy.ix_(rows, targets)] = held[:, at]
    cols = [
        numpy.asarray(steps, _I64),
        numpy.asarray([found[x][0] for x in steps], _I64),
        values[:, 0].astype(_I64),
        values[:, 1].astype(_I64),
        values[:, 2],
    ]
    maps: list[dict[str, numpy.ndarray]] = [{}, {}, {}]
    for i, name in enumerate(names, 3):
        maps[0][name] = values[:, i].copy()
        maps[1][name] = states[:, i] == _NULL
        maps[2][name] = states[:, i] != 0
    return Records.of(cols, maps, {})


def _joined(held: list[Records]) -> Records:
    cols = [numpy.concatenate([r.columns()[i] for r in held]) for i in range(5)]
    names = list(held[0].values)
    maps = [{n: numpy.concatenate([r.maps()[i][n] for r in held]) for n in names} for i in range(3)]
    return Records.of(cols, maps, {})


def _blobs(s: Session, job_id: str, nodes: list[Node]) -> dict[Node, bytes]:
    """The stored exemplar blobs of ``nodes``: one statement on PostgreSQL (a primary-key
    range per run of consecutive keys), one index range per such run on SQLite."""
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for n in nodes:
        groups[(n.level, n.attempt)].append(n.idx)
    spans = [(*g, lo, hi) for g, ids in groups.items() for lo, hi in consecutive(sorted(ids))]
    out: dict[Node, bytes] = {}
    if not spans:
        return out
    conn: Any = s.connection().connection.driver_connection
    if s.get_bind().dialect.name == "postgresql":
        columns = [list(c) for c in zip(*spans, strict=True)]
        with conn.cursor(binary=True) as cur:  # bytea as is, not hex text
            for level, attempt, idx, data in cur.execute(_BLOBS_PG, (*columns, job_id)).fetchall():
                out[Node(attempt, level, idx)] = bytes(data)
        return out
    for level, attempt, lo, hi in spans:
        for idx, data in conn.execute(_BLOBS_SQLITE, (job_id, level, lo, hi, attempt)):
            out[Node(attempt, level, idx)] = bytes(data)
    return out


# LATERAL + OFFSET 0: one primary-key range per span whatever the planner knows (see
# chunk_stats._NODES_PG).
_BLOBS_PG = (
    "SELECT k.level, k.attempt, e.idx, e.data FROM unnest(%s::int[], %s::int[], %s::int[], "
    "%s::int[]) AS k(level, attempt, lo, hi) CROSS JOIN LATERAL (SELECT idx, data FROM "
    "metric_exemplars e WHERE e.job_id = %s AND e.level = k.level AND e.idx BETWEEN k.lo "
    "AND k.hi AND e.attempt = k.attempt OFFSET 0) e"
)
_BLOBS_SQLITE = (
    "SELECT idx, data FROM metric_exemplars WHERE job_id = ? AND level = ? "
    "AND idx BETWEEN ? AND ? AND attempt = ?"
)
