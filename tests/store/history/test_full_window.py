"""A full-resolution step window (``series_window`` when the window holds at most
``max_points`` steps: :func:`~amptrain.store.history.chunk_pages.window_between`, a range of
each series' chunks) gives every effective point of the window, exactly as the chosen-steps
read (``window_at``, a lookup per chunk) gives the same steps: where its edges cut chunks of
several attempts, where a retry re-recorded steps, with gaps, NaN/inf/null values and a
subset of fields. And its statements walk primary keys on a never-analysed database, as many
for a run three times as long. Real SQLite and PostgreSQL; the run is recorded through the
recorder's chunk write (``rollups.record``), no rows."""

from __future__ import annotations

import math
import random
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import STORED_METRIC_FIELDS
from amptrain.contract.spec import JobSpec
from amptrain.store import jobs
from amptrain.store.history import rollups
from amptrain.store.history.chunk_pages import window_at, window_between
from amptrain.store.history.downsample import series_window
from amptrain.store.history.window import parse_fields
from tests.store.history.test_consumer_plans import _plan
from tests.support.plans import SORT_NODE

Sessions = sessionmaker[Session]
T0 = 1_700_000_000_000


def _job(sessions: Sessions, steps: int) -> str:
    spec = JobSpec.model_validate(
        {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "max_steps": steps}
    )
    with sessions.begin() as s:
        return jobs.create_job(s, spec, "alice", "cpu").id


def _points(job_id: str, attempt: int, steps: list[int], seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for step in steps:
        roll = rng.random()
        loss: float | None = rng.choice([math.nan, math.inf, None]) if roll < 0.03 else roll
        ms = T0 + attempt * 10**8 + step
        row: dict[str, Any] = dict.fromkeys(STORED_METRIC_FIELDS)
        row.update(job_id=job_id, attempt=attempt, step=step, stream_ms=ms, stream_seq=0)
        row.update(time=ms / 1000, loss=loss, lr=1e-3 * attempt, skipped=roll > 0.99)
        row.update(grad_norm=math.nan if roll > 0.985 else 1 + roll, memory_allocated=step)
        out.append(row)
    return out


def retried(sessions: Sessions, steps: int, seed: int = 3) -> str:
    """Attempt 1 records 0..steps-1 (a few never recorded); attempt 2 resumes at 60% and
    stops at 85%, before attempt 1's last step; attempt 3 resumes at 80% and runs 10% past
    the end. Batches of 500, as the recorder writes them."""
    rng = random.Random(seed)
    job_id = _job(sessions, steps)
    at = [int(steps * f) for f in (0.6, 0.85, 0.8, 1.1)]
    runs = [
        [s for s in range(steps) if rng.random() > 0.02],
        list(range(at[0], at[1])),
        list(range(at[2], at[3])),
    ]
    for attempt, run in enumerate(runs, 1):
        points = _points(job_id, attempt, run, seed + attempt)
        for lo in range(0, len(points), 500):
            with sessions.begin() as s:
                rollups.record(s, points[lo : lo + 500], [])
    return job_id


def test_the_window_gives_every_effective_point_of_chunks_cut_across_attempts(
    db: tuple[sa.Engine, Sessions],
) -> None:
    _, sessions = db
    job_id = retried(sessions, 4000)
    windows = [
        (2401, 3390, None),  # edges in chunks of attempts 1+2 and 1+2+3
        (3199, 3201, None),  # inside one chunk of three attempts
        (3390, 4399, parse_fields("loss,lr")),  # past attempt 1's end
        (0, 4399, None),  # the whole run
        (17, 300, parse_fields("grad_norm")),  # one attempt, gaps
    ]
    with sessions() as s:
        for first, last, fields in windows:
            got = window_between(s, job_id, first, last, fields)
            chosen = window_at(s, job_id, list(range(first, last + 1)), fields)
            assert got == [item | {"downsampled": False} for item in chosen], (first, last)
            assert [i["step"] for i in got] == sorted({i["step"] for i in got})
            assert all(first <= i["step"] <= last for i in got)
            window = series_window(s, job_id, 10_000, fields, first, last)
            assert window.items == got
        # the newest attempt wins where attempts overlap
        (point,) = window_between(s, job_id, 3300, 3300, parse_fields("lr"))
        assert point["attempt"] == 3 and point["lr"] == 3e-3


def test_the_window_searches_the_primary_key_without_statistics(
    db: tuple[sa.Engine, Sessions],
) -> None:
    engine, sessions = db
    seen: list[tuple[str, Any]] = []

    def spy(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "metric_chunks" in statement or "metric_rollups" in statement:
            seen.append((statement, params))

    counts = []
    for steps in (3000, 9000):
        job_id = retried(sessions, steps, seed=steps)
        seen.clear()
        sa.event.listen(engine, "before_cursor_execute", spy)
        try:
            with sessions() as s:
                got = series_window(s, job_id, 10_000, None, steps - 2000, steps + 50)
        finally:
            sa.event.remove(engine, "before_cursor_execute", spy)
        assert got.items and not any(i["downsampled"] for i in got.items)
        counts.append(len(seen))
    assert counts[0] == counts[1]
    for statement, params in seen:
        plan = _plan(engine, statement, params)
        if engine.dialect.name == "sqlite":
            assert "SCAN metric_chunks" not in plan and "SCAN metric_rollups" not in plan, plan
        elif "metric_chunks" in statement:
            assert not any(w in plan for w in ("Seq Scan", SORT_NODE, "Aggregate")), plan
        else:
            assert "Seq Scan" not in plan, plan
