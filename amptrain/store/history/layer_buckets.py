"""The steps a layer-norm window keeps per bucket (:mod:`amptrain.store.history.eval_window`'s
rule for a kind without per-name extremes): its first and last record and the first step
holding the bucket's highest norm of any layer.

The same pieces as :func:`~amptrain.store.history.chunk_stats.series_stats` (each name's
roll-ups where one attempt alone recorded the steps, its decoded chunks where a bucket cuts
a chunk or attempts overlap), but only the four columns the rule needs, folded over every
name at once in numpy: merged name by name into ``Stats`` objects, the ~31,600 roll-ups of a
1M-step run's window (129 layers) were most of the read. Folding across names first is
exact: a bucket's first step is the least of its names' first steps, its top the greatest of
their highs, and the first step holding the top the least of the steps holding it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy
from sqlalchemy.orm import Session

from amptrain.store.history.chunk_cover import Node, Raw, Run, pieces
from amptrain.store.history.chunk_stats import decoded_effective, node_rows

_FIRST, _LAST, _COUNT, _HIGH, _HIGH_STEP = 0, 1, 2, 9, 10
"""Where :data:`~amptrain.store.history.rollups.STATS`' columns the rule reads lie."""
_NO_STEP = numpy.iinfo(numpy.int64).max


def kept_steps(
    s: Session, job_id: str, kind: str, runs: Mapping[str, list[Run]], ranges: list[tuple[int, int]]
) -> set[int]:
    """Per ascending, disjoint step range of ``ranges`` (the buckets) that holds a value of a
    series named in ``runs`` (each with its attempt runs): its first and last step holding
    one and the first step holding its highest finite value of any name."""
    bucket_of, wanted, raws = _covers(runs, ranges)
    cols: list[list[float]] = [[], [], [], [], []]  # bucket, first, last, high, high step
    for (name, node), row in node_rows(s, job_id, kind, wanted):
        if not row[_COUNT]:
            continue
        high = row[_HIGH]
        cols[0].append(bucket_of[name][node])
        cols[1].append(row[_FIRST])
        cols[2].append(row[_LAST])
        cols[3].append(numpy.nan if high is None else high)
        cols[4].append(_NO_STEP if row[_HIGH_STEP] is None else row[_HIGH_STEP])
    bucket = numpy.asarray(cols[0], numpy.int64)
    first = numpy.asarray(cols[1], numpy.int64)
    last = numpy.asarray(cols[2], numpy.int64)
    high = numpy.asarray(cols[3], numpy.float64)
    high_step = numpy.asarray(cols[4], numpy.int64)
    decoded = decoded_effective(s, job_id, kind, raws)
    if decoded:
        # a decoded chunk of a name is read only where that name's cover cuts it, so each
        # of its steps in the window belongs to the bucket holding it
        steps = numpy.concatenate([d[0] for d in decoded.values()])
        values = numpy.concatenate([d[1] for d in decoded.values()])
        starts = numpy.asarray([a for a, _ in ranges], numpy.int64)
        inside = (steps >= ranges[0][0]) & (steps <= ranges[-1][1])
        steps, values = steps[inside], values[inside]
        finite = numpy.isfinite(values)
        bucket = numpy.concatenate([bucket, numpy.searchsorted(starts, steps, "right") - 1])
        first = numpy.concatenate([first, steps])
        last = numpy.concatenate([last, steps])
        high = numpy.concatenate([high, numpy.where(finite, values, numpy.nan)])
        high_step = numpy.concatenate([high_step, numpy.where(finite, steps, _NO_STEP)])
    return _fold(len(ranges), bucket, first, last, high, high_step)


def _covers(
    runs: Mapping[str, list[Run]], ranges: list[tuple[int, int]]
) -> tuple[dict[str, dict[Node, int]], list[tuple[str, Node]], set[tuple[str, int, int]]]:
    """Per name its roll-ups' buckets, every ``(name, roll-up)`` to read and every
    ``(name, chunk, attempt)`` to decode."""
    # names recorded alike share their pieces: per attempt runs, each roll-up's bucket and
    # the (chunk, attempt) pairs decoded
    shared: dict[tuple[Run, ...], tuple[dict[Node, int], set[tuple[int, int]]]] = {}
    wanted: list[tuple[str, Node]] = []
    raws: set[tuple[str, int, int]] = set()
    bucket_of: dict[str, dict[Node, int]] = {}
    for name, r in runs.items():
        got = shared.get(tuple(r))
        if got is None:
            got = shared[tuple(r)] = ({}, set())
            for k, (a, b) in enumerate(ranges):
                for p in pieces(r, a, b):
                    if isinstance(p, Raw):
                        got[1].update((p.chunk, x) for x in p.attempts)
                    else:
                        got[0][p] = k
        bucket_of[name] = got[0]
        wanted += [(name, p) for p in got[0]]
        raws.update((name, c, x) for c, x in got[1])
    return bucket_of, wanted, raws


def _fold(
    n: int,
    bucket: numpy.ndarray,
    first: numpy.ndarray,
    last: numpy.ndarray,
    high: numpy.ndarray,
    high_step: numpy.ndarray,
) -> set[int]:
    """Per bucket of ``n``, from its parts' aggregates (NaN: no finite value), the kept
    steps."""
    lo = numpy.full(n, _NO_STEP)
    numpy.minimum.at(lo, bucket, first)
    hi = numpy.full(n, -1)
    numpy.maximum.at(hi, bucket, last)
    held = ~numpy.isnan(high)
    top = numpy.full(n, -numpy.inf)
    numpy.maximum.at(top, bucket[held], high[held])
    at_top = held.copy()
    at_top[held] = high[held] == top[bucket[held]]
    top_step = numpy.full(n, _NO_STEP)
    numpy.minimum.at(top_step, bucket[at_top], high_step[at_top])
    chosen = set(lo[lo != _NO_STEP].tolist()) | set(hi[hi >= 0].tolist())
    return chosen | set(top_step[top_step != _NO_STEP].tolist())
