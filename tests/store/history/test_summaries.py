"""Metric summaries (no longer read by the API: tests/support/summary_window.py keeps the
read that used them, an oracle of the chunk reads): a downsampled history read from them is the read from the points,
whatever the batches, retries, replays and windows; the migration's backfill builds the
same summaries as live recording and as rebuilding. Real SQLite/PostgreSQL."""

from __future__ import annotations

import math
import random
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import PARALLEL_METRIC_FIELDS, STORED_METRIC_FIELDS
from amptrain.contract.spec import JobSpec
from amptrain.store import migrate, recording
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.history import chunk_writes, summary_writes
from amptrain.store.history import layout as summary_layout
from amptrain.store.history import rebuild as summary_rebuild
from amptrain.store.history.summary_reads import open_view
from amptrain.store.history.window import parse_fields
from amptrain.store.models import MetricPoint, MetricSummary, MetricSummaryState
from tests.support.old_schema import create_old_job
from tests.support.row_window import raw_window
from tests.support.summary_window import series_window

Sessions = sessionmaker[Session]
T0 = 1_700_000_000_000


def new_job(sessions: Sessions) -> str:
    """A job in the columns of revision 0004 (the oldest these tests start from)."""
    spec = JobSpec.model_validate(
        {
            "model": {"name": "mlp"},
            "dataset": {"name": "synthetic-classification"},
            "max_steps": 100_000,
        }
    )
    with sessions.begin() as s:
        return create_old_job(s, spec, "tester", "cpu")


def series(
    job_id: str, steps: list[int], attempt: int = 1, seed: int = 0, ms: int = T0
) -> list[dict[str, Any]]:
    """Points with ties (values on a coarse grid), NaN/inf/null losses, non-finite grad
    norms and skipped steps."""
    rng = random.Random(seed)
    rows = []
    for i, step in enumerate(steps):
        loss: float | None = round(rng.uniform(0, 3), 1)
        roll = rng.random()
        if roll < 0.01:
            loss = None
        elif roll < 0.02:
            loss = math.nan
        elif roll < 0.03:
            loss = math.inf
        grad = rng.choice([1.0, 2.0, 0.5, 1.0, 1.0, 9.0]) if rng.random() > 0.01 else math.inf
        rows.append(
            dict.fromkeys(STORED_METRIC_FIELDS)
            | {
                "job_id": job_id,
                "attempt": attempt,
                "stream_ms": ms + i,
                "stream_seq": 0,
                "step": step,
                "time": 1000.0 + step,
                "loss": loss,
                "grad_norm": grad,
                "skipped": rng.random() < 0.02,
                "loss_scale": rng.choice([32768.0, 65536.0]),
                "lr": 1e-3,
                "samples_per_second": rng.choice([100.0, 120.0, 80.0]),
                "step_time_ms": None if rng.random() < 0.1 else rng.uniform(5, 6),
                "memory_allocated": rng.choice([10**8, 2 * 10**8, 10**8 + 7]),
            }
        )
    return rows


def record(sessions: Sessions, job_id: str, rows: list[dict[str, Any]], sizes: list[int]) -> None:
    """The recorder's transaction: insert, then summarise what was inserted."""
    i = 0
    for size in sizes:
        batch = rows[i : i + size]
        i += size
        with sessions.begin() as s:
            inserted: Any = recording.insert_points(s, batch)
            if isinstance(inserted, dict):  # per job when the recorder writes several at once
                inserted = inserted.get(job_id, set())
            new = [p for p in batch if (p["attempt"], p["step"]) in inserted]
            summary_writes.add_points(s, {job_id: new})
            chunk_writes.append(s, batch, [])  # what the cursor reads read
    assert i >= len(rows)


def seed(sessions: Sessions, rows: list[dict[str, Any]]) -> None:
    """Points written without summaries (e.g. by a script): the rows and their chunks."""
    with sessions.begin() as s:
        s.execute(sa.insert(MetricPoint), rows)
        chunk_writes.append(s, rows, [])


def random_sizes(n: int, rng: random.Random) -> list[int]:
    sizes = []
    while sum(sizes) < n:
        sizes.append(rng.choice([1, 3, 17, 100, 333, 1000]))
    return sizes


def same_answer(sessions: Sessions, job_id: str, n: int, **kw: Any) -> None:
    with sessions() as s:
        assert open_view(s, job_id)[0] is not None  # the summaries are read, not the points
        fast = series_window(s, job_id, n, **kw)
        slow = raw_window(s, job_id, n, **kw)
    assert fast.items == slow.items, kw
    assert fast.marks == slow.marks, kw
    assert fast.next_cursor == slow.next_cursor


def nodes(sessions: Sessions, job_id: str) -> dict[tuple[int, int], tuple[Any, ...]]:
    m = MetricSummary
    cols = [getattr(m, c) for c in summary_layout.COLUMNS]
    with sessions() as s:
        rows = s.execute(sa.select(m.level, m.idx, *cols).where(m.job_id == job_id)).all()
        state = s.execute(
            sa.select(MetricSummaryState.stream_ms, MetricSummaryState.stream_seq).where(
                MetricSummaryState.job_id == job_id
            )
        ).one()
    return {(r[0], r[1]): tuple(r[2:]) for r in rows} | {(-1, 0): tuple(state)}


WINDOWS: list[dict[str, Any]] = [
    {},
    {"from_step": 1001},
    {"to_step": 3333},
    {"from_step": 17, "to_step": 4093},
    {"from_step": 250, "to_step": 2047, "fields": parse_fields("loss,memory_allocated")},
    {"fields": parse_fields("lr")},
    {"fields": None, "from_step": 5, "to_step": 4999},
]


def test_summaries_answer_as_the_points_do(db: tuple[sa.Engine, Sessions]) -> None:
    _, sessions = db
    rng = random.Random(7)
    job_id = new_job(sessions)
    steps = [s for s in range(1, 5001) if rng.random() > 0.03]  # a few steps never recorded
    rows = series(job_id, steps, seed=1)
    record(sessions, job_id, rows[:2500], random_sizes(2500, rng))
    same_answer(sessions, job_id, 40)  # a run still growing
    record(sessions, job_id, rows[2500:], random_sizes(len(rows) - 2500, rng))
    for kw in WINDOWS:
        for n in (1, 40, 300) if kw else (1, 6, 40, 300, 700):
            same_answer(sessions, job_id, n, **kw)
    with sessions() as s:
        # Every flagged step fits in 700 points: all are kept.
        flagged = series_window(s, job_id, 700).marks
    assert sum(m["flagged"] for m in flagged) > len(flagged)


def test_a_retry_re_recording_from_a_checkpoint_changes_the_summaries(
    db: tuple[sa.Engine, Sessions],
) -> None:
    _, sessions = db
    rng = random.Random(3)
    job_id = new_job(sessions)
    first = series(job_id, list(range(0, 1500)), attempt=1, seed=2)
    record(sessions, job_id, first, random_sizes(len(first), rng))
    # Attempt 2 resumed from step 900 and got further, with different values.
    second = series(job_id, list(range(900, 2500)), attempt=2, seed=3, ms=T0 + 10_000)
    # Its first batch carries attempt 1's last points too (one stream, read in order).
    record(sessions, job_id, first[-50:] + second, [80, *random_sizes(len(second), rng)])
    # (The points' way is slow on a retried job in SQLite: a few reads only.)
    for kw in ({}, {"from_step": 701, "to_step": 2047}, {"fields": None, "to_step": 1999}):
        for n in (3, 90):
            same_answer(sessions, job_id, n, **kw)
    live = nodes(sessions, job_id)
    with sessions.begin() as s:
        summary_rebuild.rebuild(s, job_id)
    assert nodes(sessions, job_id) == live


def test_batches_and_replays_do_not_change_the_summaries(db: tuple[sa.Engine, Sessions]) -> None:
    _, sessions = db
    rng = random.Random(5)
    one, many = new_job(sessions), new_job(sessions)
    steps = list(range(3, 2600))
    record(sessions, one, series(one, steps, seed=9), [len(steps)])
    rows = series(many, steps, seed=9)
    record(sessions, many, rows, random_sizes(len(rows), rng))
    assert nodes(sessions, one) == nodes(sessions, many)
    record(sessions, many, rows[100:900], [800])  # a replay inserts nothing
    assert nodes(sessions, one) == nodes(sessions, many)


def test_many_jobs_summarised_in_one_transaction_each_get_their_own(
    db: tuple[sa.Engine, Sessions],
) -> None:
    """The recorder summarises every job of a batch at once: a new job, a growing one, a
    retried one and one whose points were written without summaries, side by side, each
    end with what rebuilding it from its points gives."""
    _, sessions = db
    fresh, growing, retried, seeded = (new_job(sessions) for _ in range(4))
    record(sessions, growing, series(growing, list(range(0, 700)), seed=12), [700])
    record(sessions, retried, series(retried, list(range(0, 900)), seed=13), [900])
    seed(sessions, series(seeded, list(range(0, 500)), seed=14))
    batch = {
        fresh: series(fresh, list(range(5, 1300)), seed=15),
        growing: series(growing, list(range(700, 2100)), seed=16, ms=T0 + 5000),
        retried: series(retried, list(range(400, 1200)), attempt=2, seed=17, ms=T0 + 5000),
        seeded: series(seeded, list(range(500, 800)), seed=18, ms=T0 + 5000),
    }
    with sessions.begin() as s:
        inserted = recording.insert_points(s, [p for rows in batch.values() for p in rows])
        chunk_writes.append(s, [p for rows in batch.values() for p in rows], [])
        summary_writes.add_points(
            s,
            {
                job: [p for p in rows if (p["attempt"], p["step"]) in inserted[job]]
                for job, rows in batch.items()
            },
        )
    live = {job: nodes(sessions, job) for job in batch}
    for job in batch:
        with sessions.begin() as s:
            summary_rebuild.rebuild(s, job)
        assert nodes(sessions, job) == live[job], job
        same_answer(sessions, job, 40)


def test_points_written_without_summaries_are_never_misread(
    db: tuple[sa.Engine, Sessions],
) -> None:
    _, sessions = db
    job_id = new_job(sessions)
    rows = series(job_id, list(range(1, 3001)), seed=4)
    record(sessions, job_id, rows[:1000], [1000])
    seed(sessions, [{**r, "loss": 99.0} for r in rows[1000:2000]])  # no summaries
    with sessions() as s:
        assert open_view(s, job_id)[0] is None
        read = series_window(s, job_id, 40)
        assert read.items == raw_window(s, job_id, 40).items
    assert 99.0 in [p["loss"] for p in read.items]
    # A job whose first summarised batch finds other points is summarised from all of them.
    other = new_job(sessions)
    seed(sessions, series(other, list(range(1, 2001)), seed=5))
    more = series(other, list(range(2001, 3001)), seed=6, ms=T0 + 5000)
    record(sessions, other, more, [1000])
    same_answer(sessions, other, 40)


def test_the_migrations_backfill_builds_what_recording_and_rebuilding_build(
    database_url: str,
) -> None:
    migrate.upgrade(database_url, "0004")
    engine = make_engine(database_url)
    sessions = make_session_factory(engine)
    try:
        old, retried = new_job(sessions), new_job(sessions)
        rows = series(old, list(range(0, 2100)), seed=8)
        again = series(retried, list(range(0, 1500)), seed=10) + series(
            retried, list(range(900, 2300)), attempt=2, seed=11, ms=T0 + 9000
        )
        old_columns = [
            {k: v for k, v in r.items() if k not in PARALLEL_METRIC_FIELDS} for r in rows + again
        ]
        with engine.begin() as conn:
            conn.execute(sa.insert(MetricPoint), old_columns)
        migrate.upgrade(database_url)
        backfilled = nodes(sessions, old), nodes(sessions, retried)
        assert len(backfilled[0]) > 100 and backfilled[1][(-1, 0)][0] == T0 + 9000 + 1399
        # The SQL the migration kept builds what today's rebuild builds from the same points.
        for job_id in (old, retried):
            with sessions.begin() as s:
                summary_rebuild.rebuild(s, job_id)
        assert (nodes(sessions, old), nodes(sessions, retried)) == backfilled
        with sessions.begin() as s:
            s.execute(sa.delete(MetricSummary))
            s.execute(sa.delete(MetricSummaryState))
            s.execute(sa.delete(MetricPoint))
        record(sessions, old, rows, [700, 700, 700])
        record(sessions, retried, again, [1000, 1000, 900])
        assert (nodes(sessions, old), nodes(sessions, retried)) == backfilled
        same_answer(sessions, retried, 40, from_step=33)
    finally:
        engine.dispose()
