"""Building the roll-ups (:mod:`amptrain.store.history.rollups`) from chunks already stored:
migration 0016 for every job, and data loaded straight into ``metric_chunks`` (benchmarks).

In bounded batches: the chunks of :data:`BATCH` aligned chunk indexes of one series at a
time (for step series with the loss, grad norm and skipped chunks of the same steps, which
decide the flags), decoded into level-0 roll-ups; then levels 4 and 8 folded from level 0
in key order. Every write is an upsert of a value computed from the chunks alone, so a
build interrupted and run again ends with the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy
import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.store.chunk_models import MetricChunk, MetricRollup
from amptrain.store.history import exemplar_build
from amptrain.store.history.chunk_codec import CHUNK_STEPS
from amptrain.store.history.chunk_parts import rolled_up
from amptrain.store.history.chunk_writes import STEP_KIND
from amptrain.store.history.rollups import FLAG_SERIES, LEVELS, STATS, Stats, upsert
from amptrain.store.history.series_scan import decode_masked

BATCH = 1024
"""Aligned chunk indexes per batch (262,144 steps of a series)."""


def rebuild(s: Session, job_id: str | None = None, exemplars: bool = True) -> None:
    """Every roll-up of one job (or of every job) from its chunks, then (``exemplars``;
    migrations 0016 and 0017 predate their table) the exemplars from both."""
    c = MetricChunk
    query = sa.select(c.job_id, c.kind, c.name).group_by(c.job_id, c.kind, c.name)
    if job_id is not None:
        query = query.where(c.job_id == job_id)
    series = s.execute(query.order_by(c.job_id, c.kind, c.name)).all()
    for job, kind, name in series:
        if not rolled_up(kind, name):
            continue
        span = s.execute(
            sa.select(sa.func.min(c.chunk), sa.func.max(c.chunk)).where(
                c.job_id == job, c.kind == kind, c.name == name
            )
        ).one()
        for start in range(span[0], span[1] + 1, BATCH):
            _level0(s, job, kind, name, start, start + BATCH - 1)
        fold_levels(s, job, kind, name)
    if exemplars:
        exemplar_build.rebuild(s, job_id)


def _chunks(
    s: Session, job: str, kind: str, name: str, lo: int, hi: int
) -> Iterator[tuple[int, int, numpy.ndarray, numpy.ndarray, numpy.ndarray]]:
    c = MetricChunk
    rows = s.execute(
        sa.select(c.chunk, c.attempt, c.data)
        .where(c.job_id == job, c.kind == kind, c.name == name, c.chunk.between(lo, hi))
        .order_by(c.chunk, c.attempt)
    )
    for chunk, attempt, data in rows:
        yield chunk, attempt, *decode_masked(chunk * CHUNK_STEPS, bytes(data))


def _level0(s: Session, job: str, kind: str, name: str, lo: int, hi: int) -> None:
    marks: dict[tuple[int, int], tuple[numpy.ndarray, numpy.ndarray]] = {}
    if kind == STEP_KIND:
        parts = {
            n: {(k, a): (st, v, m) for k, a, st, v, m in _chunks(s, job, kind, n, lo, hi)}
            for n in FLAG_SERIES
        }
        for key, (steps, loss, _) in parts["loss"].items():
            norm = parts["grad_norm"].get(key)
            skip = parts["skipped"].get(key)
            skipped = values_at(steps, skip, 0.0) == 1
            bad_loss = ~numpy.isfinite(loss)
            gn = values_at(steps, norm, 0.0, nulls_as=0.0)
            marks[key] = (skipped, skipped | bad_loss | ~numpy.isfinite(gn))
    rows: list[tuple[Any, ...]] = []
    for chunk, attempt, steps, values, _ in _chunks(s, job, kind, name, lo, hi):
        skipped, flagged = marks.get((chunk, attempt), (None, None))
        stats = array_stats(steps, values, skipped, flagged)
        rows.append((job, kind, name, 0, chunk, attempt, *stats.row()))
    upsert(s, rows)


def array_stats(
    steps: numpy.ndarray,
    values: numpy.ndarray,
    skipped: numpy.ndarray | None = None,
    flagged: numpy.ndarray | None = None,
) -> Stats:
    """The aggregates of ascending ``steps`` and their ``values`` (NaN where null), with the
    step series' per-step skipped and flagged marks (None: a named series)."""
    stats = Stats()
    n = len(steps)
    if not n:
        return stats
    finite = numpy.isfinite(values)
    stats.first_step, stats.last_step, stats.count = int(steps[0]), int(steps[-1]), n
    stats.non_finite = int(n - numpy.count_nonzero(finite))
    if skipped is not None and flagged is not None:
        stats.skipped = int(numpy.count_nonzero(skipped))
        stats.flagged = int(numpy.count_nonzero(flagged))
        if stats.flagged:
            stats.first_flag = int(steps[numpy.argmax(flagged)])
    if stats.non_finite < n:
        held, at = values[finite], steps[finite]
        low, high = int(numpy.argmin(held)), int(numpy.argmax(held))  # the first of ties
        stats.low, stats.low_step = float(held[low]), int(at[low])
        stats.high, stats.high_step = float(held[high]), int(at[high])
    return stats


def segment_stats(
    steps: numpy.ndarray,
    values: numpy.ndarray,
    marks: tuple[numpy.ndarray, numpy.ndarray] | None,
    starts: numpy.ndarray,
    stops: numpy.ndarray,
) -> list[Stats]:
    """:func:`array_stats` of each slice ``starts[i]:stops[i]`` of ascending ``steps`` and
    their ``values`` at once (numpy over every slice: a read's buckets cut thousands of
    chunks); ``marks``: the step series' skipped and flagged marks (None: a named series)."""
    k = len(starts)
    lengths = (stops - starts).astype(numpy.int64)
    seg = numpy.repeat(numpy.arange(k), lengths)
    idx = numpy.arange(len(seg)) - numpy.repeat(numpy.cumsum(lengths) - lengths, lengths)
    idx += numpy.repeat(starts, lengths)
    at, v = steps[idx], values[idx]
    finite = numpy.isfinite(v)
    cols: dict[str, list[Any]] = {
        c: [None] * k for c in ("first_flag", "low", "low_step", "high", "high_step")
    }
    cols["non_finite"] = (lengths - numpy.bincount(seg[finite], minlength=k)).tolist()
    cols["skipped"] = cols["flagged"] = [0] * k
    if marks is not None:
        skipped, flagged = marks[0][idx], marks[1][idx]
        cols["skipped"] = numpy.bincount(seg[skipped], minlength=k).tolist()
        cols["flagged"] = numpy.bincount(seg[flagged], minlength=k).tolist()
        _firsts(cols["first_flag"], seg[flagged], at[flagged], at[flagged])
    held, held_at = v[finite], at[finite]
    _firsts(cols["low"], seg[finite], (held_at, held), held)
    _firsts(cols["low_step"], seg[finite], (held_at, held), held_at)
    _firsts(cols["high"], seg[finite], (held_at, -held), held)
    _firsts(cols["high_step"], seg[finite], (held_at, -held), held_at)
    first = steps[numpy.minimum(starts, len(steps) - 1)].tolist() if len(steps) else [0] * k
    last = steps[numpy.maximum(stops - 1, 0)].tolist() if len(steps) else [0] * k
    out = []
    for i, n in enumerate(lengths.tolist()):
        if not n:
            out.append(Stats())
            continue
        row = (first[i], last[i], n, *(cols[c][i] for c in STATS[3:]))
        out.append(Stats(row))
    return out


def _firsts(out: list[Any], seg: numpy.ndarray, keys: Any, picked: numpy.ndarray) -> None:
    """Per segment, ``picked`` at its first element by ``keys`` (ascending, the last key
    first, as lexsort orders; an array: already in order) into ``out``."""
    order = numpy.lexsort((*keys, seg)) if isinstance(keys, tuple) else numpy.arange(len(seg))
    held, first = numpy.unique(seg[order], return_index=True)
    for s, x in zip(held.tolist(), picked[order[first]].tolist(), strict=True):
        out[s] = x


def values_at(
    steps: numpy.ndarray,
    series: tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray] | None,
    missing: float,
    nulls_as: float | None = None,
) -> numpy.ndarray:
    """The values of another series of the same chunk at ``steps`` (``missing`` where it has
    none; ``nulls_as``: what a null reads as, else NaN)."""
    out = numpy.full(len(steps), missing)
    if series is None:
        return out
    at, values, nulls = series
    values = values.copy()
    if nulls_as is not None:
        values[nulls] = nulls_as
    where = numpy.searchsorted(at, steps)
    hit = (where < len(at)) & (at[numpy.minimum(where, len(at) - 1)] == steps)
    out[hit] = values[where[hit]]
    return out


def fold_levels(s: Session, job: str, kind: str, name: str) -> None:
    """Levels above 0 of one series, folded from its level-0 roll-ups in key order."""
    r = MetricRollup
    query = (
        sa.select(r.idx, r.attempt, *(getattr(r, c) for c in Stats.__slots__))
        .where(r.job_id == job, r.kind == kind, r.name == name, r.level == 0)
        .order_by(r.idx, r.attempt)
    )
    top = max(LEVELS)
    groups: dict[tuple[int, int, int], Stats] = {}
    block = None
    # Read whole before writing (a series' level 0 is a row per 256 steps): SQLite does not
    # promise what a cursor sees of a table written under it.
    for idx, attempt, *row in s.execute(query).all():
        if block is not None and idx >> top != block:
            _flush(s, job, kind, name, groups)
        block = idx >> top
        for level in LEVELS[1:]:
            stats = groups.setdefault((level, idx >> level, attempt), Stats())
            stats.merge(Stats(row))
    _flush(s, job, kind, name, groups)


def _flush(
    s: Session, job: str, kind: str, name: str, groups: dict[tuple[int, int, int], Stats]
) -> None:
    upsert(s, [(job, kind, name, *key, *stats.row()) for key, stats in groups.items()])
    groups.clear()
