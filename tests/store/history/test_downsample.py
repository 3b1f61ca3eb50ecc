"""GET /jobs/{id}/metrics?max_points=N: a whole run in at most N points, computed in SQL,
with loss spikes kept. Real SQLite/PostgreSQL; the big case holds 1,000,000 points."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.spec import JobSpec
from amptrain.store import jobs
from amptrain.store.db import make_session_factory
from amptrain.store.history import rollups
from amptrain.store.history.downsample import downsample, series_window
from amptrain.store.history.window import parse_fields

COLUMNS = ("job_id", "attempt", "stream_ms", "stream_seq", "step", "time", "loss", "loss_scale")
Row = tuple[str, int, int, int, int, float, float | None, float | None]


def new_job(sessions: sessionmaker[Session]) -> str:
    spec = JobSpec.model_validate(
        {
            "name": "long",
            "model": {"name": "mlp", "args": {}},
            "dataset": {"name": "synthetic-classification", "args": {}},
            "max_steps": 1_000_000,
        }
    )
    with sessions.begin() as s:
        return jobs.create_job(s, spec, "tester", "cpu").id


def bulk_insert(engine: sa.Engine, rows: Iterable[Row]) -> None:
    """The test data through the recorder's own write (chunks and roll-ups),
    :data:`SEED_BATCH` points a transaction."""
    it = iter(rows)
    with make_session_factory(engine)() as s:
        while batch := list(itertools.islice(it, SEED_BATCH)):
            rollups.record(s, [dict(zip(COLUMNS, r, strict=True)) for r in batch], [])
            s.commit()


SEED_BATCH = 50_000


def points(
    job_id: str, steps: Iterable[int], attempt: int = 1, spike: int | None = None
) -> Iterator[Row]:
    t0 = 1_700_000_000_000
    for step in steps:
        loss = 50.0 if step == spike else 1.0 / math.sqrt(step)
        yield (job_id, attempt, t0 + step, attempt, step, t0 / 1000 + step, loss, 65536.0)


@pytest.mark.heavy
def test_a_million_steps_in_a_thousand_points_keeps_the_spike(
    db: tuple[sa.Engine, sessionmaker[Session]],
) -> None:
    """A run of a million steps recorded every 8th step (125,001 points: a read's work
    follows the span of steps, and seeding a dense million took half a minute per database
    here; bench/history_query.py reads dense runs)."""
    engine, sessions = db
    job_id = new_job(sessions)
    steps = [*range(1, 1_000_000, 8), 1_000_000]  # 777,777 among them
    bulk_insert(engine, points(job_id, steps, spike=777_777))
    statements: list[str] = []

    def spy(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    sa.event.listen(engine, "before_cursor_execute", spy)
    started = time.perf_counter()
    with sessions() as s:
        items, newest = downsample(s, job_id, 1000)
    elapsed = time.perf_counter() - started
    sa.event.remove(engine, "before_cursor_execute", spy)
    print(f"\n{engine.dialect.name}: 1,000,000 points -> {len(items)} in {elapsed * 1000:.0f} ms")

    assert 0 < len(items) <= 1000
    steps = [p["step"] for p in items]
    assert steps == sorted(set(steps)) and steps[0] == 1 and steps[-1] == 1_000_000
    assert all(p["downsampled"] for p in items)
    spike = [p for p in items if p["loss"] == 50.0]
    assert [p["step"] for p in spike] == [777_777]
    assert newest == f"{1_700_000_000_000 + 1_000_000}-1"
    # A few statements, the buckets read from the chunks' roll-ups: no pass over the points
    # (they are read only for the newest cursor and the chosen steps).
    assert len(statements) <= 12, statements


@pytest.mark.parametrize("max_points", [1, 2, 3, 4, 7, 40, 399])
def test_never_more_than_max_points(
    db: tuple[sa.Engine, sessionmaker[Session]], max_points: int
) -> None:
    engine, sessions = db
    job_id = new_job(sessions)
    bulk_insert(engine, points(job_id, range(1, 5001), spike=4321))
    with sessions() as s:
        items, _ = downsample(s, job_id, max_points)
    assert 0 < len(items) <= max_points
    assert 4321 in [p["step"] for p in items]  # the spike survives even at one point


def test_constant_loss_ties_stay_bounded(db: tuple[sa.Engine, sessionmaker[Session]]) -> None:
    engine, sessions = db
    job_id = new_job(sessions)
    rows = [(job_id, 1, 10 + i, 0, i, 0.0, 1.0, None) for i in range(1, 3001)]
    bulk_insert(engine, rows)
    with sessions() as s:
        items, _ = downsample(s, job_id, 100)
    assert len(items) <= 100


def test_small_runs_come_whole_and_fields_filter(
    db: tuple[sa.Engine, sessionmaker[Session]],
) -> None:
    engine, sessions = db
    job_id = new_job(sessions)
    bulk_insert(engine, points(job_id, range(1, 51)))
    with sessions() as s:
        items, _ = downsample(s, job_id, 100, fields=parse_fields("loss"))
        empty, cursor = downsample(s, new_job(sessions), 10)
    assert [p["step"] for p in items] == list(range(1, 51))
    assert set(items[0]) == {"step", "attempt", "cursor", "downsampled", "loss"}
    assert not any(p["downsampled"] for p in items)
    assert (empty, cursor) == ([], None)
    with pytest.raises(ValueError, match="nope"):
        parse_fields("loss,nope")


def test_retried_job_downsamples_the_effective_series(
    db: tuple[sa.Engine, sessionmaker[Session]],
) -> None:
    engine, sessions = db
    job_id = new_job(sessions)
    # Attempt 1 reached step 600 with a spike at 550; attempt 2 resumed from 500.
    bulk_insert(engine, points(job_id, range(1, 601), attempt=1, spike=550))
    bulk_insert(
        engine,
        (
            (j, 2, ms + 10_000, 2, st, t, lo, sc)
            for j, _, ms, _, st, t, lo, sc in points(job_id, range(501, 2001), attempt=2)
        ),
    )
    with sessions() as s:
        items, _ = downsample(s, job_id, 40)
    assert len(items) <= 40
    assert all(p["attempt"] == 2 for p in items if p["step"] > 500)
    assert 50.0 not in [p["loss"] for p in items]  # the superseded attempt's spike is gone


@pytest.mark.parametrize("window", [None, (10_001, 12_000)])
def test_each_bucket_names_its_last_point(
    db: tuple[sa.Engine, sessionmaker[Session]], window: tuple[int, int] | None
) -> None:
    """A smoothed chart reads one point per bucket (its last), not the min/max kept for
    spikes, which would make a smoothed noisy run look raw. Whole run: from the roll-ups;
    a short window: from the chunks."""
    engine, sessions = db
    job_id = new_job(sessions)
    bulk_insert(engine, points(job_id, range(1, 30_001), spike=20_500))
    lo, hi = window or (None, None)
    with sessions() as s:
        items = series_window(s, job_id, 400, parse_fields("loss"), lo, hi).items
    lasts = [p["step"] for p in items if p["bucket_last"]]
    assert all(p["downsampled"] for p in items) and 20 < len(lasts) < len(items)
    assert lasts[-1] == (hi or 30_000)
    widths = {b - a for a, b in itertools.pairwise(lasts[:-1])}  # the newest may be short
    assert len(widths) == 1, widths  # evenly spaced: every bucket's last, only those
    (width,) = widths
    assert all(step % width == width - 1 for step in lasts[:-1])  # aligned buckets
