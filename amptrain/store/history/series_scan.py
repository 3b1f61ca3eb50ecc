"""Every series of a job's effective history at full resolution, series after series, in
blocks of consecutive steps: what a whole-run export reads (``GET /jobs/{id}/metrics/export``).

A stand-in over today's narrow tables (``metric_points``, ``metric_values``), reading the
effective series exactly as the cursor pages do (per step the newest attempt's value); the
chunked metric store replaces this module with one of the same interface.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy
import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.metrics import EVAL_KIND, LAYER_NORM_KIND, STEP_METRICS
from amptrain.store.history.points import newest_attempt
from amptrain.store.history.values import effective_value
from amptrain.store.models import MetricPoint, MetricValue

BLOCK = 65_536
"""Steps a block holds at most: a read's memory stays bounded whatever the run's length."""
STEP_SERIES: tuple[str, ...] = tuple(
    m.name for m in STEP_METRICS if m.name != "step" and m.type != "ints"
)
"""The per-step fields that are series of numbers (``memory_peak_per_rank``, a list per
step, is not)."""
KIND_OF = {EVAL_KIND: "eval", LAYER_NORM_KIND: "layer"}
"""A block's ``kind`` for each kind of named series."""


@dataclass(frozen=True, slots=True)
class SeriesBlock:
    """Consecutive steps of one series."""

    kind: str
    """``step`` (a per-step field of :mod:`amptrain.contract.metrics`), ``eval`` or ``layer``."""
    name: str
    """The field, eval metric or layer name."""
    steps: numpy.ndarray
    """int64, strictly increasing."""
    values: numpy.ndarray
    """float64; NaN/inf kept as recorded (a value stored as null reads NaN)."""


def scan_run(session: Session, job_id: str) -> Iterator[SeriesBlock]:
    """Every series of a job's effective history (per step the newest attempt's value),
    at full resolution, series after series, in blocks of consecutive steps in step
    order, without loading the run whole."""
    for field in _recorded_fields(session, job_id):
        column = MetricPoint.__table__.c[field]
        where = [MetricPoint.job_id == job_id, newest_attempt(MetricPoint)]
        yield from _blocks(session, "step", field, MetricPoint, column, where)
    v = MetricValue
    names = session.execute(
        sa.select(v.kind, v.name).where(v.job_id == job_id).distinct().order_by(v.kind, v.name)
    ).all()
    for kind, name in names:
        where = [v.job_id == job_id, v.kind == kind, v.name == name, effective_value(v)]
        yield from _blocks(session, KIND_OF.get(kind, kind), name, v, v.value, where)


def _recorded_fields(session: Session, job_id: str) -> list[str]:
    """The step fields with at least one value in the job's points (a bf16 run has no loss
    scale, a one-device run no data-parallel fields)."""
    table = MetricPoint.__table__
    counts = session.execute(
        sa.select(*(sa.func.count(table.c[f]) for f in STEP_SERIES)).where(table.c.job_id == job_id)
    ).one()
    return [f for f, n in zip(STEP_SERIES, counts, strict=True) if n]


def _blocks(
    session: Session, kind: str, name: str, table: Any, column: Any, where: list[Any]
) -> Iterator[SeriesBlock]:
    """One series' effective values (``column`` of ``table`` where ``where``), a block at a
    time, keyset-paged by step."""
    last = -1
    while True:
        rows = session.execute(
            sa.select(table.step, column)
            .where(table.step > last, *where)
            .order_by(table.step)
            .limit(BLOCK)
        ).all()
        if not rows:
            return
        steps = numpy.fromiter((r[0] for r in rows), numpy.int64, len(rows))
        values = numpy.fromiter(
            (numpy.nan if r[1] is None else r[1] for r in rows), numpy.float64, len(rows)
        )
        yield SeriesBlock(kind, name, steps, values)
        last = int(steps[-1])
