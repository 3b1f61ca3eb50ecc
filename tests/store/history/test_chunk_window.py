"""The downsampled reads from the chunks' roll-ups return, byte for byte, what the reads from
the points returned (tests/support/row_window.py, from the rows the old writers wrote) for runs
recorded through the recorder's writes: retries that resume from an earlier checkpoint and
stop before their predecessor's last step, NaN/inf/null losses, non-finite grad norms,
skipped steps, unrecorded steps; whole run and windows, many budgets; and the roll-ups the
recorder keeps batch by batch are the ones rebuilding them from the chunks gives. Real
SQLite and PostgreSQL."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.store.chunk_models import MetricRollup
from amptrain.store.history import rollup_rebuild, rollups
from amptrain.store.history.downsample import series_window
from amptrain.store.history.window import parse_fields
from tests.support import history_data
from tests.support.history_data import T0, new_job, random_sizes, series
from tests.support.row_tables import MetricPoint
from tests.support.row_window import raw_window

Sessions = sessionmaker[Session]


def record(sessions: Sessions, job_id: str, rows: list[dict[str, Any]], sizes: list[int]) -> None:
    """The recorder's transactions (the chunks with their roll-ups), and the rows the old
    writers wrote beside them for the points' oracle."""
    history_data.record(sessions, rows, sizes)


def as_json(window: Any) -> str:
    return json.dumps(window.__dict__, sort_keys=True)


def same_answer(sessions: Sessions, job_id: str, n: int, **kw: Any) -> None:
    with sessions() as s:
        got = as_json(series_window(s, job_id, n, **kw))
        assert got == as_json(raw_window(s, job_id, n, **kw)), (n, kw)


def retried_run(sessions: Sessions, seed: int) -> str:
    """Attempt 1 records 0..2999 (with a few steps never recorded); attempt 2 resumes from a
    checkpoint at 1800 and stops at 2600, before attempt 1's last step; attempt 3 resumes
    at 2550 and runs to 4200. Random batch sizes, and each attempt's first batch re-sends
    its predecessor's last points (one stream, read in order)."""
    rng = random.Random(seed)
    job_id = new_job(sessions)
    one = series(job_id, [s for s in range(0, 3000) if rng.random() > 0.02], 1, seed)
    two = series(job_id, list(range(1800, 2601)), 2, seed + 1, T0 + 10_000)
    three = series(job_id, list(range(2550, 4201)), 3, seed + 2, T0 + 20_000)
    record(sessions, job_id, one, random_sizes(len(one), rng))
    record(sessions, job_id, one[-40:] + two, [60, *random_sizes(len(two), rng)])
    record(sessions, job_id, two[-40:] + three, [60, *random_sizes(len(three), rng)])
    return job_id


WINDOWS: list[dict[str, Any]] = [
    {},
    {"from_step": 1700, "to_step": 2700},  # around the resume points
    {"from_step": 2999, "to_step": 3000},
    {"from_step": 255, "to_step": 4097},
    {"from_step": 1000, "fields": parse_fields("loss,memory_allocated,lr")},
    {"to_step": 2600, "fields": parse_fields("grad_norm")},
    {"from_step": 20_000},  # nothing there
]


def test_a_retried_run_reads_as_from_the_points(db: tuple[sa.Engine, Sessions]) -> None:
    _, sessions = db
    job_id = retried_run(sessions, 21)
    # (The points' way, the oracle, is slow on a retried run in SQLite: a few budgets.)
    for kw in WINDOWS:
        for n in (5, 300) if kw else (1, 7, 150, 2000, 5000):
            same_answer(sessions, job_id, n, **kw)
    with sessions() as s:
        # Every flagged step fits in 2,000 points: all are kept, the marks count them.
        marks = series_window(s, job_id, 2000).marks
    assert sum(m["flagged"] for m in marks) > len(marks)


def test_a_growing_run_reads_as_from_the_points_after_every_batch(
    db: tuple[sa.Engine, Sessions],
) -> None:
    _, sessions = db
    rng = random.Random(4)
    job_id = new_job(sessions)
    rows = series(job_id, list(range(1, 6000)), seed=4)
    done = 0
    for size in (1, 255, 1, 700, 3000, 2042):
        record(sessions, job_id, rows[done : done + size], [size])
        done += size
        same_answer(sessions, job_id, rng.choice([3, 40, 200]))
        same_answer(sessions, job_id, 40, from_step=done // 2)


def test_kept_roll_ups_are_rebuilt_roll_ups_and_replays_change_nothing(
    db: tuple[sa.Engine, Sessions],
) -> None:
    _, sessions = db
    job_id = retried_run(sessions, 8)

    def stored() -> dict[tuple[Any, ...], tuple[Any, ...]]:
        r = MetricRollup.__table__.c
        with sessions() as s:
            rows = s.execute(sa.select(r).where(r.job_id == job_id)).all()
        return {tuple(row[:6]): tuple(row[6:]) for row in rows}

    kept = stored()
    assert {key[3] for key in kept} == {0, 4, 8}
    # no read takes the reserved step series' roll-ups (chunk_parts.rolled_up): none is kept
    assert "loss" in {key[2] for key in kept}
    assert not [key for key in kept if key[2].startswith("@")]
    with sessions.begin() as s:
        again = series(job_id, list(range(1800, 2601)), 2, 9, T0 + 10_000)
        rollups.record(s, again[100:500], [])  # a re-sent range
    assert stored() == kept
    with sessions.begin() as s:
        s.execute(sa.delete(MetricRollup).where(MetricRollup.job_id == job_id))
        rollup_rebuild.rebuild(s, job_id)
    assert stored() == kept


@pytest.mark.parametrize("n", [1, 3, 17, 64, 333])
def test_a_single_attempt_with_gaps_reads_as_from_the_points(
    db: tuple[sa.Engine, Sessions], n: int
) -> None:
    _, sessions = db
    rng = random.Random(n)
    job_id = new_job(sessions)
    steps = sorted(rng.sample(range(0, 70_000), 7000))  # sparse: chunks with gaps
    rows = series(job_id, steps, seed=n)
    record(sessions, job_id, rows, [len(rows)])
    same_answer(sessions, job_id, n)
    same_answer(sessions, job_id, n, from_step=steps[100], to_step=steps[-100])
    same_answer(sessions, job_id, n * 10, from_step=4096, to_step=65_535)


def test_windows_read_no_rows_and_only_the_chunks_they_need(
    db: tuple[sa.Engine, Sessions],
) -> None:
    """The items come from the chunks: with the rows of ``metric_points`` gone, every
    window still reads as before; and an open-ended full-resolution read of a short run
    touches its own chunks only, in a few statements (not one per possible chunk number)."""
    engine, sessions = db
    job_id = retried_run(sessions, 5)
    asked = [(5, {}), (300, {"from_step": 1700, "to_step": 2700}), (20_000, {})]
    asked += [(9, {"fields": parse_fields("loss,lr")}), (6000, {"from_step": 1000})]
    with sessions() as s:
        before = [as_json(raw_window(s, job_id, n, **kw)) for n, kw in asked]
    with sessions.begin() as s:
        s.execute(sa.delete(MetricPoint).where(MetricPoint.job_id == job_id))
    statements: list[str] = []

    def spy(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    sa.event.listen(engine, "before_cursor_execute", spy)
    try:
        with sessions() as s:
            after = [as_json(series_window(s, job_id, n, **kw)) for n, kw in asked]
    finally:
        sa.event.remove(engine, "before_cursor_execute", spy)
    assert after == before
    assert len(statements) < 20 * len(asked), len(statements)
    assert not any("metric_points" in st for st in statements)
