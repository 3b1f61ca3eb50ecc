"""Step series written straight into ``metric_chunks`` and ``metric_rollups`` (one attempt,
every step ``1..n``), a block of 65,536 steps at a time: a 10M-step run in a minute or two,
never all in memory. Benchmark data, not the code under test (the recorder's own path is
:func:`amptrain.store.history.rollups.record`); the chunks are the codec's, the roll-ups
the rebuild's (:mod:`amptrain.store.history.rollup_rebuild`), the exemplars built from
both (:mod:`amptrain.store.history.exemplar_build`)."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping

import numpy
from sqlalchemy.orm import Session

from amptrain.store.history import (
    chunk_codec,
    chunk_table,
    exemplar_build,
    rollup_rebuild,
    rollups,
)
from amptrain.store.history.chunk_codec import CHUNK_STEPS
from amptrain.store.history.chunk_writes import STEP_KIND

Series = Callable[[numpy.ndarray], numpy.ndarray]
"""Steps (int64) -> their values (float64; NaN for null)."""
BLOCK = 256 * CHUNK_STEPS


def load(s: Session, job_id: str, steps: int, series: Mapping[str, Series]) -> None:
    """Chunks and roll-ups of ``series`` (which must hold ``loss``, ``grad_norm`` and
    ``skipped``: they decide the flags) over steps ``1..steps`` of attempt 1."""
    for start in range(0, steps + 1, BLOCK):
        at = numpy.arange(max(1, start), min(steps, start + BLOCK - 1) + 1, dtype=numpy.int64)
        values = {name: fn(at) for name, fn in series.items()}
        skipped = values["skipped"] == 1
        flagged = skipped | ~numpy.isfinite(values["loss"]) | ~numpy.isfinite(values["grad_norm"])
        chunks, stats = [], []
        bounds = numpy.flatnonzero(numpy.diff(at // CHUNK_STEPS)) + 1
        for part in numpy.split(numpy.arange(len(at)), bounds):
            chunk = int(at[part[0]]) // CHUNK_STEPS
            st = array("q", at[part].tobytes())
            for name, v in values.items():
                vals = array("d", v[part].tobytes())
                s_ = rollup_rebuild.array_stats(at[part], v[part], skipped[part], flagged[part])
                data = chunk_codec.encode(chunk * CHUNK_STEPS, st, vals, None, True)
                ends = (float(v[part][0]), float(v[part][-1]))
                head = (job_id, STEP_KIND, name, chunk, 1, s_.first_step, s_.last_step, s_.count)
                tail = (None, None, data, chunk_table.is_open(chunk, s_.last_step))
                chunks.append((*head, s_.non_finite, s_.skipped, s_.low, s_.high, *ends, *tail))
                stats.append((job_id, STEP_KIND, name, 0, chunk, 1, *s_.row()))
        chunk_table.upsert(s, chunks)
        rollups.upsert(s, stats)
    for name in series:
        rollup_rebuild.fold_levels(s, job_id, STEP_KIND, name)
    exemplar_build.rebuild(s, job_id)
