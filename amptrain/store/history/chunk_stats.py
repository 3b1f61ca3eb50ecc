"""The aggregates (:class:`~amptrain.store.history.rollups.Stats`) of a job's effective
series (the step fields, or each evaluation or layer name: :func:`series_stats`) over many
step ranges at once, from roll-ups and decoded chunks
(:mod:`amptrain.store.history.chunk_cover` says which): a downsampled read's buckets. The
decoded parts of a series are aggregated in one numpy pass
(:func:`~amptrain.store.history.rollup_rebuild.segment_stats`).

Every roll-up a read needs comes in one statement on PostgreSQL (a join with the unnested
keys) and in one index range per run of consecutive keys on SQLite; so do the chunks it
decodes. Nothing here depends on planner statistics: every statement walks the primary key.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy
import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.store.chunk_models import MetricRollup
from amptrain.store.history import chunk_load
from amptrain.store.history.chunk_codec import CHUNK_STEPS
from amptrain.store.history.chunk_cover import Node, Piece, Raw, Run, pieces
from amptrain.store.history.chunk_parts import KEY_SERIES as KEY_SERIES
from amptrain.store.history.chunk_writes import STEP_KIND
from amptrain.store.history.rollup_rebuild import segment_stats, values_at
from amptrain.store.history.rollups import FLAG_SERIES, LEVELS, STATS, Stats
from amptrain.store.history.window import runs as consecutive

_SHIFT = CHUNK_STEPS.bit_length() - 1
Arrays = tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]
"""Steps, values (NaN where null) and the null mask of a chunk's effective values."""


def range_stats(
    s: Session, job_id: str, runs: list[Run], names: Sequence[str], ranges: list[tuple[int, int]]
) -> list[dict[str, Stats]]:
    """Per inclusive step range, per step series of ``names``, its aggregates."""
    return series_stats(s, job_id, STEP_KIND, {name: runs for name in names}, ranges)


def series_stats(
    s: Session,
    job_id: str,
    kind: str,
    runs: Mapping[str, list[Run]],
    ranges: list[tuple[int, int]],
) -> list[dict[str, Stats]]:
    """Per inclusive step range, per series of ``kind`` named in ``runs`` (each with its own
    attempt runs: an evaluation's names are re-recorded apart), its aggregates. For the step
    kind the flags come from the steps' loss, grad norm and skipped values."""
    shared: dict[tuple[Run, ...], list[list[Piece]]] = {}  # names recorded alike share them
    for r in runs.values():
        if tuple(r) not in shared:
            shared[tuple(r)] = [pieces(r, a, b) for a, b in ranges]
    covers = {name: shared[tuple(r)] for name, r in runs.items()}
    nodes = {(n, p) for n, cs in covers.items() for c in cs for p in c if isinstance(p, Node)}
    raws = {
        (n, p.chunk, a)
        for n, cs in covers.items()
        for c in cs
        for p in c
        if isinstance(p, Raw)
        for a in p.attempts
    }
    if kind == STEP_KIND:  # what decides a decoded step's flags
        raws |= {(f, c, a) for _, c, a in list(raws) for f in FLAG_SERIES}
    stored = _nodes(s, job_id, kind, nodes)
    decoded = decoded_effective(s, job_id, kind, raws)
    out: list[dict[str, Stats]] = [{} for _ in ranges]
    for name, cs in covers.items():
        cut = _raw_stats(name, cs, decoded, kind)
        for k, cover in enumerate(cs):
            out[k][name] = total = Stats()
            for piece in cover:
                if isinstance(piece, Node):
                    total.merge(stored.get((name, piece)) or Stats())
                else:
                    total.merge(cut[(k, piece.first)])
    return out


def _raw_stats(
    name: str, covers: list[list[Piece]], decoded: dict[tuple[str, int], Arrays], kind: str
) -> dict[tuple[int, int], Stats]:
    """The aggregates of every decoded piece of ``name``'s covers, by (cover, first step):
    one numpy pass over the name's decoded chunks."""
    raw = [(k, p) for k, c in enumerate(covers) for p in c if isinstance(p, Raw)]
    if not raw:
        return {}
    chunks = sorted({p.chunk for _, p in raw})
    held = [decoded.get((name, c), _EMPTY) for c in chunks]
    steps = numpy.concatenate([h[0] for h in held])
    values = numpy.concatenate([h[1] for h in held])
    marks = None
    if kind == STEP_KIND:
        per_chunk = [flags(decoded, c, h[0]) for c, h in zip(chunks, held, strict=True)]
        marks = (
            numpy.concatenate([m[0] for m in per_chunk]),
            numpy.concatenate([m[1] for m in per_chunk]),
        )
    starts = numpy.searchsorted(steps, [p.first for _, p in raw])
    stops = numpy.searchsorted(steps, [p.last + 1 for _, p in raw])
    stats = segment_stats(steps, values, marks, starts, stops)
    return {(k, p.first): st for (k, p), st in zip(raw, stats, strict=True)}


_EMPTY: Arrays = (numpy.zeros(0, numpy.int64), numpy.zeros(0), numpy.zeros(0, bool))


def flags(
    decoded: dict[tuple[str, int], Arrays], chunk: int, steps: numpy.ndarray
) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Per step of ``steps`` (of ``chunk``): skipped, and flagged (skipped, a non-finite or
    null loss, a NaN or infinite grad norm)."""
    skipped = values_at(steps, decoded.get(("skipped", chunk)), 0.0) == 1
    loss = values_at(steps, decoded.get(("loss", chunk)), numpy.nan)
    norm = values_at(steps, decoded.get(("grad_norm", chunk)), 0.0, nulls_as=0.0)
    return skipped, skipped | ~numpy.isfinite(loss) | ~numpy.isfinite(norm)


def _nodes(
    s: Session, job_id: str, kind: str, wanted: Iterable[tuple[str, Node]]
) -> dict[tuple[str, Node], Stats]:
    return {key: Stats(row) for key, row in node_rows(s, job_id, kind, wanted)}


def node_rows(
    s: Session, job_id: str, kind: str, wanted: Iterable[tuple[str, Node]]
) -> Iterator[tuple[tuple[str, Node], Sequence[Any]]]:
    """The stored roll-ups ``(name, node)`` of ``wanted`` that exist, each with its columns
    of :data:`STATS` (as the driver gives them: a layer-norm window reads ~30,000)."""
    groups: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    for name, n in wanted:
        groups[(name, n.level, n.attempt)].append(n.idx)
    if not groups:
        return
    conn: Any = s.connection().connection.driver_connection
    if s.get_bind().dialect.name == "postgresql":
        # Every run of consecutive keys as one index range, all in one statement.
        spans = [(*g, lo, hi) for g, ids in groups.items() for lo, hi in consecutive(sorted(ids))]
        # Rows in binary, all at once: a whole-run read of a 10M-step run takes ~3,100 of
        # them, whose text parsing, row by row, cost 6 ms of client CPU (binary: 2.3).
        with conn.cursor(binary=True) as cur:
            columns = [list(c) for c in zip(*spans, strict=True)]
            rows = cur.execute(_NODES_PG, (*columns, job_id, kind)).fetchall()
        for name, level, idx, attempt, *row in rows:
            yield (name, Node(attempt, level, idx)), row
        return
    for (name, level, attempt), ids in groups.items():
        for where, keys in _sqlite_keys(ids):
            params = (job_id, kind, name, level, attempt, *keys)
            for idx, *row in conn.execute(_NODES_SQLITE + where.format(col="r.idx"), params):
                yield (name, Node(attempt, level, idx)), row


def _sqlite_keys(ids: Iterable[int]) -> list[tuple[str, tuple[int, ...]]]:
    """A SQLite statement's key condition per part of ``ids``: a range per run of
    consecutive keys, the lone keys in IN lists of up to 500 (a window whose buckets cut
    every chunk has few runs: a statement each, 43,000 of them for a 100k-step run's
    layer norms, were most of the read)."""
    spans = consecutive(sorted(ids))
    lone = [lo for lo, hi in spans if lo == hi]
    out: list[tuple[str, tuple[int, ...]]] = [
        (" AND {col} BETWEEN ? AND ?", (lo, hi)) for lo, hi in spans if lo < hi
    ]
    for i in range(0, len(lone), 500):
        part = tuple(lone[i : i + 500])
        out.append((f" AND {{col}} IN ({', '.join('?' * len(part))})", part))
    return out


_STATS = ", ".join(f"r.{c}" for c in STATS)
# LATERAL: one primary-key range per key, whatever the planner knows (a never-analysed
# table can otherwise get a hash join over every row of the table); OFFSET 0 keeps the
# planner from flattening the LATERAL into such a join (see _CHUNKS_PG).
_NODES_PG = (
    f"SELECT k.name, k.level, r.idx, k.attempt, {_STATS} FROM unnest(%s::text[], %s::int[], "
    "%s::int[], %s::int[], %s::int[]) AS k(name, level, attempt, lo, hi) CROSS JOIN LATERAL "
    "(SELECT * FROM metric_rollups r WHERE r.job_id = %s AND r.kind = %s AND "
    "r.name = k.name AND r.level = k.level AND r.idx BETWEEN k.lo AND k.hi "
    "AND r.attempt = k.attempt OFFSET 0) r"
)
_NODES_SQLITE = (
    f"SELECT r.idx, {_STATS} FROM metric_rollups r WHERE r.job_id = ? AND r.kind = ? "
    "AND r.name = ? AND r.level = ? AND r.attempt = ?"
)


def effective_chunks(
    s: Session, job_id: str, names: Sequence[str], raws: Iterable[tuple[tuple[int, ...], int]]
) -> dict[tuple[str, int], Arrays]:
    """Per step series of ``names`` and chunk, the effective values of the chunks of the
    given attempts: per step the newest attempt's value."""
    wanted = {(name, chunk, a) for name in names for atts, chunk in raws for a in atts}
    return decoded_effective(s, job_id, STEP_KIND, wanted)


def decoded_effective(
    s: Session, job_id: str, kind: str, wanted: Iterable[tuple[str, int, int]]
) -> dict[tuple[str, int], Arrays]:
    """Per (name, chunk) of the chunks ``(name, chunk, attempt)`` of ``kind``: per step the
    newest attempt's value."""
    rows = _chunk_data(s, job_id, kind, sorted(wanted))
    found = chunk_load.decode_many([((n, c, a), c * CHUNK_STEPS, bytes(d)) for n, c, a, d in rows])
    parts: dict[tuple[str, int], list[tuple[int, Arrays]]] = defaultdict(list)
    for (name, chunk, attempt), got in found.items():
        nulls = numpy.zeros(len(got.steps), bool) if got.nulls is None else got.nulls
        parts[(name, chunk)].append((attempt, (got.steps, got.values, nulls)))
    out: dict[tuple[str, int], Arrays] = {}
    for key, held in parts.items():
        held.sort(key=lambda p: -p[0])  # newest first
        if len(held) == 1:
            out[key] = held[0][1]
            continue
        steps, values, nulls = (numpy.concatenate([h[1][i] for h in held]) for i in range(3))
        kept, first = numpy.unique(steps, return_index=True)  # the first: the newest's
        out[key] = (kept, values[first], nulls[first])
    return out


def _chunk_data(
    s: Session, job_id: str, kind: str, wanted: list[tuple[str, int, int]]
) -> Iterable[tuple[str, int, int, bytes]]:
    if not wanted:
        return []
    conn: Any = s.connection().connection.driver_connection
    if s.get_bind().dialect.name == "postgresql":
        keys = [list(c) for c in zip(*wanted, strict=True)]
        with conn.cursor(binary=True) as cur:  # bytea as is, not hex text (see node_rows)
            return cur.execute(_CHUNKS_PG, (*keys, job_id, kind)).fetchall()
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    for name, chunk, attempt in wanted:
        groups[(name, attempt)].append(chunk)
    out: list[tuple[str, int, int, bytes]] = []
    for (name, attempt), chunks in groups.items():
        for where, ids in _sqlite_keys(chunks):
            sql = _CHUNKS_SQLITE + where.format(col="chunk")
            rows = conn.execute(sql, (job_id, kind, name, attempt, *ids))
            out += [(name, chunk, attempt, data) for chunk, data in rows]
    return out


_CHUNKS_PG = (
    "SELECT k.name, k.chunk, k.attempt, c.data FROM unnest(%s::text[], %s::int[], %s::int[]) "
    "AS k(name, chunk, attempt) CROSS JOIN LATERAL (SELECT data FROM metric_chunks c WHERE "
    "c.job_id = %s AND c.kind = %s AND c.name = k.name AND c.chunk = k.chunk "
    "AND c.attempt = k.attempt OFFSET 0) c"
)
"""OFFSET 0 keeps the LATERAL a primary-key lookup per key: flattened into a join, a
never-analysed table's plan took 3-7 s of a whole-run read of a 10M-step run of 11 fields
(bench/history_query.py), 40 ms with it."""
_CHUNKS_SQLITE = (
    "SELECT chunk, data FROM metric_chunks WHERE job_id = ? AND kind = ? "
    "AND name = ? AND attempt = ?"
)


def flagged_steps(s: Session, job_id: str, runs: list[Run], lo: int, hi: int) -> set[int]:
    """Every flagged step of the effective series in ``lo..hi``: the top roll-ups holding
    flagged steps, their chunks' level-0 roll-ups that do, those chunks decoded (the
    newest attempt of each step decides)."""
    r = MetricRollup
    top = max(LEVELS)
    series = (r.job_id == job_id, r.kind == STEP_KIND, r.name == KEY_SERIES, r.flagged > 0)
    first, last = lo >> _SHIFT, hi >> _SHIFT
    blocks = s.scalars(
        sa.select(r.idx)
        .where(*series, r.level == top, r.idx.between(first >> top, last >> top))
        .distinct()
    ).all()
    chunks: set[int] = set()
    for block in blocks:
        chunks.update(
            s.scalars(
                sa.select(r.idx).where(
                    *series,
                    r.level == 0,
                    r.idx.between(max(first, block << top), min(last, ((block + 1) << top) - 1)),
                )
            )
        )
    owners = {c: run[2] for c in chunks for run in runs if run[0] <= c <= run[1]}
    decoded = effective_chunks(s, job_id, FLAG_SERIES, [(a, c) for c, a in owners.items()])
    out: set[int] = set()
    for c in owners:
        steps = decoded.get((KEY_SERIES, c), _EMPTY)[0]
        _, flagged = flags(decoded, c, steps)
        held = steps[flagged & (steps >= lo) & (steps <= hi)]
        out.update(int(x) for x in held)
    return out
