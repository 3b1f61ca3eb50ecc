"""Every series of a job at full resolution, streamed from its chunks (``metric_chunks``,
:mod:`amptrain.store.history.chunk_writes`): what a whole-run export reads.

One statement walks the job's range of the chunks' primary key (job, kind, name, chunk,
attempt) in key order, through a server-side cursor on PostgreSQL (the driver's lazy
cursor on SQLite), so memory holds one block and one chunk's attempts, whatever the run's
length (the reserved series of :mod:`~amptrain.store.history.chunk_parts` are not
exported: the cursor and record times are the store's, not the run's). Per step the newest attempt's value wins (the effective series every read
returns: a retry resumes from a checkpoint and re-records the steps after it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy
import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.metrics import EVAL_KIND, LAYER_NORM_KIND
from amptrain.store.chunk_models import MetricChunk
from amptrain.store.history import chunk_load
from amptrain.store.history.chunk_codec import CHUNK_STEPS
from amptrain.store.history.chunk_parts import RESERVED, STEP_KIND

BLOCK_VALUES = 65_536
"""Values per block at most: a block is 1 MiB of steps and values."""
KINDS = {STEP_KIND: "step", EVAL_KIND: "eval", LAYER_NORM_KIND: "layer"}
"""``metric_chunks.kind`` -> :attr:`SeriesBlock.kind`."""
_FETCH = 256
"""Chunks fetched per round trip."""


@dataclass(frozen=True, slots=True)
class SeriesBlock:
    kind: str
    """``"step"`` (a per-step field of contract/metrics.py), ``"eval"`` or ``"layer"``."""
    name: str
    """The field, eval metric or layer name."""
    steps: numpy.ndarray
    """int64, strictly increasing."""
    values: numpy.ndarray
    """float64 (NaN/inf kept as recorded; a null value reads as NaN)."""


def scan_run(session: Session, job_id: str) -> Iterator[SeriesBlock]:
    """Every series of a job's EFFECTIVE history (per step the newest attempt's value, as
    every read returns), at full resolution, series after series, each in blocks of
    consecutive steps in step order, without loading the run whole (bounded memory)."""
    c = MetricChunk
    # A field no step of the run holds a number for (the loss scale of an fp32 run, the
    # data-parallel fields of one process) is not a series: its chunks hold only nulls.
    held_series = set(
        session.execute(
            sa.select(c.kind, c.name)
            .where(c.job_id == job_id, ~c.name.startswith(RESERVED, autoescape=True))
            .group_by(c.kind, c.name)
            .having(sa.func.max(c.high).is_not(None))
        )
    )
    query = (
        sa.select(c.kind, c.name, c.chunk, c.attempt, c.data)
        .where(c.job_id == job_id, ~c.name.startswith(RESERVED, autoescape=True))
        .order_by(c.kind, c.name, c.chunk, c.attempt)
        .execution_options(stream_results=True, yield_per=_FETCH)
    )
    series: tuple[str, str] | None = None
    chunk = -1
    attempts: list[tuple[numpy.ndarray, numpy.ndarray]] = []
    steps: list[numpy.ndarray] = []
    values: list[numpy.ndarray] = []
    held = 0
    for part in session.execute(query).partitions():
        # Each fetched part decoded at once (chunk_load.decode_many: one un-shuffle for all
        # its chunks); a chunk decoded alone cost more than its values' Parquet encoding.
        rows = [r for r in part if (r[0], r[1]) in held_series]
        found = chunk_load.decode_many(
            [(i, r[2] * CHUNK_STEPS, _bytes(r[4])) for i, r in enumerate(rows)]
        )
        for i, (kind, name, idx, _attempt, _) in enumerate(rows):
            if (kind, name) != series or idx != chunk:
                if attempts:
                    s, v = _effective(attempts)
                    steps.append(s)
                    values.append(v)
                    held += len(s)
                    attempts = []
                if series is not None and ((kind, name) != series or held >= BLOCK_VALUES):
                    yield _block(series, steps, values)
                    steps, values, held = [], [], 0
                series, chunk = (kind, name), idx
            attempts.append((found[i].steps, found[i].values))
    if attempts and series is not None:
        s, v = _effective(attempts)
        steps.append(s)
        values.append(v)
    if series is not None and steps:
        yield _block(series, steps, values)


def _bytes(data: bytes | memoryview) -> bytes:
    return data if data.__class__ is bytes else bytes(data)


def decode(first_aligned: int, data: bytes) -> tuple[numpy.ndarray, numpy.ndarray]:
    """A chunk's steps and values (a null value reads as NaN) as numpy arrays."""
    chunk = chunk_load.decode(first_aligned, data)
    return chunk.steps, chunk.values


def decode_masked(
    first_aligned: int, data: bytes
) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
    """:func:`decode` and a bool array, true where the value was null (stored as NaN)."""
    chunk = chunk_load.decode(first_aligned, data)
    nulls = numpy.zeros(len(chunk.steps), bool) if chunk.nulls is None else chunk.nulls
    return chunk.steps, chunk.values, nulls


def _effective(
    attempts: list[tuple[numpy.ndarray, numpy.ndarray]],
) -> tuple[numpy.ndarray, numpy.ndarray]:
    """One aligned chunk's steps and values from every attempt's (oldest first): per step
    the newest attempt's value."""
    if len(attempts) == 1:
        return attempts[0]
    newest_first = attempts[::-1]
    steps = numpy.concatenate([a[0] for a in newest_first])
    values = numpy.concatenate([a[1] for a in newest_first])
    # numpy.unique keeps each step's first occurrence: the newest attempt's.
    kept, first = numpy.unique(steps, return_index=True)
    return kept, values[first]


def _block(
    series: tuple[str, str], steps: list[numpy.ndarray], values: list[numpy.ndarray]
) -> SeriesBlock:
    return SeriesBlock(
        KINDS.get(series[0], series[0]), series[1], *map(numpy.concatenate, (steps, values))
    )
