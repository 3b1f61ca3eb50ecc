"""A chunk's low, high and non-finite count after the recorder's appends, which combine the
stored chunk's columns with the new values' instead of rescanning the chunk
(:func:`amptrain.store.history.chunk_merge.merged_span`), are what a chunk written at once
holds: ties, signed zeros, infinities, NaN and nulls, replays and re-sent ranges.
Real SQLite and PostgreSQL."""

from __future__ import annotations

import math
import random
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.store.chunk_models import MetricChunk
from amptrain.store.history import chunk_table, chunk_writes
from tests.support.history_data import new_job, series

ODD = {
    "loss": [0.0, -0.0, math.inf, -math.inf, math.nan, None, 1.0, -1.0, 2.5],
    # Zeros of both signs at the bottom (low's ties) and at the top (high's).
    "lr": [0.0, -0.0, 1.0, math.nan, None],
    "samples_per_second": [0.0, -0.0, -1.0, math.inf, None],
    "grad_norm": [math.nan, None, 3.0],
}


def nasty(job_id: str, steps: list[int], seed: int) -> list[dict[str, Any]]:
    """Points whose values are drawn from a few odd ones: ties, zeros of both signs,
    infinities, NaN and nulls, some series with no finite value for a while."""
    rng = random.Random(seed)
    points = series(job_id, steps, seed=seed)
    for p in points:
        for name, odd in ODD.items():
            p[name] = rng.choice(odd)
    return points


def chunk_rows(sessions: sessionmaker[Session], job_id: str) -> dict[Any, tuple[Any, ...]]:
    columns = [getattr(MetricChunk, c) for c in chunk_table.COLUMNS[1:]]
    with sessions() as s:
        rows = s.execute(sa.select(*columns).where(MetricChunk.job_id == job_id)).all()
    # repr: NaN equals itself, and -0.0 differs from 0.0 where the database keeps the sign.
    return {tuple(r[:4]): repr(tuple(r[4:])) for r in rows}


def test_appended_batch_by_batch_keeps_the_span_of_the_chunk_written_at_once(
    db: tuple[sa.Engine, sessionmaker[Session]],
) -> None:
    _, sessions = db
    rng = random.Random(7)
    steps = [s for s in range(1, 1200) if rng.random() > 0.03]
    by_batch, at_once = new_job(sessions), new_job(sessions)
    points = nasty(by_batch, steps, seed=11)
    i = 0
    while i < len(points):
        n = rng.choice([1, 3, 20, 90])
        batch = points[i : i + n]
        if i and rng.random() < 0.3:  # at-least-once delivery: a range sent again
            back = rng.randrange(0, i)
            batch = points[back : min(i, back + 4)] + batch
        with sessions.begin() as s:
            chunk_writes.append(s, batch, [])
        i += n
    with sessions.begin() as s:
        chunk_writes.append(s, [p | {"job_id": at_once} for p in points], [])
    got, want = chunk_rows(sessions, by_batch), chunk_rows(sessions, at_once)
    assert len(got) > 50 and got == want
