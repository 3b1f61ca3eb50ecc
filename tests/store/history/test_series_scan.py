"""``scan_run``, the whole-run reader the export streams (the interface every metric store
provides), on real SQLite and PostgreSQL: every series once, in blocks of rising steps, the
effective history (a resumed attempt's values win), non-finite values as NaN, nothing of
another job, and no series for a field no point holds."""

from __future__ import annotations

import math
from typing import Any

import numpy
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import EVAL_KIND, LAYER_NORM_KIND, STORED_METRIC_FIELDS
from amptrain.store.history import chunk_writes
from amptrain.store.history.series_scan import scan_run
from tests.store.history.test_downsample import new_job

T0 = 1_700_000_000_000


def point(job_id: str, attempt: int, step: int) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(STORED_METRIC_FIELDS)
    loss = math.inf if step == 7 else attempt / step
    ms = T0 + 10_000 * attempt + step
    row.update(job_id=job_id, attempt=attempt, stream_ms=ms, stream_seq=0, step=step)
    row.update(time=ms / 1000, loss=loss, lr=0.1, skipped=False, skipped_steps=0)
    return row


def value(
    job_id: str, attempt: int, step: int, kind: str, name: str, v: float | None
) -> dict[str, Any]:
    ms = T0 + 10_000 * attempt + step
    return {
        "job_id": job_id,
        "attempt": attempt,
        "step": step,
        "kind": kind,
        "name": name,
        "value": v,
        "time": ms / 1000,
        "stream_ms": ms,
        "stream_seq": 1,
    }


def seed(sessions: sessionmaker[Session]) -> str:
    """Attempt 1: steps 1..300; attempt 2 resumed at 200: steps 201..350 (the loss doubles).
    Evals every 50 steps, layer norms every 100 (one null)."""
    job_id = new_job(sessions)
    points = [point(job_id, 1, s) for s in range(1, 301)]
    points += [point(job_id, 2, s) for s in range(201, 351)]
    values = [value(job_id, 1, s, EVAL_KIND, "accuracy", s / 1000) for s in range(50, 301, 50)]
    values += [
        value(job_id, 2, s, EVAL_KIND, "accuracy", 2 * s / 1000) for s in range(250, 351, 50)
    ]
    values += [
        value(job_id, 1, s, LAYER_NORM_KIND, name, None if s == 200 else s * 1.5)
        for s in range(100, 301, 100)
        for name in ("net.0", "head")
    ]
    with sessions.begin() as s:
        chunk_writes.append(s, points, values)  # as the recorder writes a batch
    return job_id


def test_every_series_once_in_rising_blocks_of_the_effective_history(
    db: tuple[sa.Engine, sessionmaker[Session]],
) -> None:
    _, sessions = db
    job_id = seed(sessions)
    seed(sessions)  # another job: none of its rows in the first's scan
    series: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
    previous = None
    with sessions() as s:
        for block in scan_run(s, job_id):
            key = (block.kind, block.name)
            assert key == previous or key not in series, f"{key} comes back"
            assert block.steps.dtype == numpy.int64 and block.values.dtype == numpy.float64
            assert len(block.steps) == len(block.values) > 0
            steps, values = series.setdefault(key, ([], []))
            assert numpy.all(numpy.diff(block.steps) > 0) and (
                not steps or block.steps[0] > steps[-1]
            )
            steps.extend(block.steps.tolist())
            values.extend(block.values.tolist())
            previous = key
    # Fields no point holds (the loss scale, the data-parallel ones, ...) are no series.
    assert {k for k, _ in series} == {"step", "eval", "layer"}
    assert {n for k, n in series if k == "step"} == {
        "time",
        "loss",
        "lr",
        "skipped",
        "skipped_steps",
    }
    steps, loss = series[("step", "loss")]
    assert steps == list(range(1, 351))
    assert loss[6] == math.inf or math.isnan(loss[6])  # SQLite stores inf; either way not finite
    assert loss[99] == 1 / 100 and loss[249] == 2 / 250  # attempt 2's from step 201 on
    assert series[("eval", "accuracy")] == (
        [50, 100, 150, 200, 250, 300, 350],
        [0.05, 0.1, 0.15, 0.2, 0.5, 0.6, 0.7],
    )
    norms = series[("layer", "head")]
    assert norms[0] == [100, 200, 300] and math.isnan(norms[1][1])
