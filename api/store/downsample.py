"""A whole run's metric series in at most N points, computed by the database.

The steps are cut into ``N // 4`` equal buckets; per bucket the first, the last, the
lowest-loss and the highest-loss point survive, so a loss spike (or the loss jump
that comes with a loss-scale collapse) stays visible at any zoom level. Three
statements, none of which brings more than a few rows per bucket into Python:

1. ``min/max(step)``, ``count`` and the attempts of the job (index on (job_id, step));
2. one GROUP BY bucket pass: first/last step, min/max loss; joined once more with the
   points to learn *which* step holds that min/max (first such step on ties);
3. the chosen rows by ``step IN (...)`` (index on (job_id, step)).

Retried jobs use the effective series (per step, the newest attempt's point), as
``GET /jobs/{id}/metrics`` does by default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, aliased

from api.contracts.cursor import Cursor
from api.store.metrics import newest_attempt, newest_cursor, point_dict
from api.store.models import MetricPoint
from trainer_core.contract.records import METRIC_FIELDS

PER_BUCKET = 4
_IN_CHUNK = 500  # stay far below any backend's bound-parameter limit


def parse_fields(text: str | None) -> list[str] | None:
    """``"loss,lr"`` -> ``["loss", "lr"]`` (None = all); ValueError naming unknown fields."""
    if not text:
        return None
    wanted = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in wanted if f not in METRIC_FIELDS]
    if unknown:
        raise ValueError(
            f"unknown fields {', '.join(unknown)}; expected some of {', '.join(METRIC_FIELDS)}"
        )
    return wanted


def select_fields(item: dict[str, Any], fields: Sequence[str] | None) -> dict[str, Any]:
    """Keep ``step``, ``attempt``, ``cursor`` (and ``downsampled``) plus the wanted fields."""
    if fields is None:
        return item
    keep = {"step", "attempt", "cursor", "downsampled", *fields}
    return {k: v for k, v in item.items() if k in keep}


def downsample(
    s: Session, job_id: str, max_points: int, fields: Sequence[str] | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """At most ``max_points`` points covering the whole run, in step order, each with
    ``downsampled`` (false when the run fits and every point is returned); and the newest
    point's cursor (pass it as ``after`` to follow the run from there)."""
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    p = MetricPoint
    mine = p.job_id == job_id
    lo, hi, count, first_attempt, last_attempt = s.execute(
        sa.select(
            sa.func.min(p.step),
            sa.func.max(p.step),
            sa.func.count(),
            sa.func.min(p.attempt),
            sa.func.max(p.attempt),
        ).where(mine)
    ).one()
    if not count:
        return [], None
    multi = first_attempt != last_attempt
    effective = newest_attempt(p) if multi else sa.true()
    newest = newest_cursor(s, job_id)
    if count <= max_points:
        rows = s.scalars(sa.select(p).where(mine, effective).order_by(p.step)).all()
        return [select_fields(_row(r, False), fields) for r in rows], _text(newest)
    buckets = max(1, max_points // PER_BUCKET)
    width = math.ceil((hi - lo + 1) / buckets)
    steps = _chosen_steps(s, job_id, int(lo), width, multi)
    rows = _rows_at(s, job_id, steps, multi_attempt=multi)
    if len(rows) > max_points:  # only when max_points < PER_BUCKET: one bucket
        rows = _most_telling(rows, max_points)
    return [select_fields(_row(r, True), fields) for r in rows], _text(newest)


def _chosen_steps(s: Session, job_id: str, lo: int, width: int, multi: bool) -> list[int]:
    p = MetricPoint
    effective = newest_attempt(p) if multi else sa.true()
    bucket = ((p.step - lo) // width).label("bucket")
    agg = (
        sa.select(
            bucket,
            sa.func.min(p.step).label("first"),
            sa.func.max(p.step).label("last"),
            sa.func.min(p.loss).label("low"),
            sa.func.max(p.loss).label("high"),
        )
        .where(p.job_id == job_id, effective)
        .group_by(bucket)
        .subquery()
    )
    q = aliased(MetricPoint)
    q_effective = newest_attempt(q) if multi else sa.true()
    extremes = (
        sa.select(
            agg.c.first,
            agg.c.last,
            sa.func.min(sa.case((q.loss == agg.c.low, q.step))),
            sa.func.min(sa.case((q.loss == agg.c.high, q.step))),
        )
        .select_from(agg)
        .join(q, sa.and_(q.job_id == job_id, q.step.between(agg.c.first, agg.c.last)))
        .where(q_effective)
        .group_by(agg.c.first, agg.c.last)
    )
    chosen: set[int] = set()
    for row in s.execute(extremes):
        chosen.update(int(v) for v in row if v is not None)
    return sorted(chosen)


def _rows_at(
    s: Session, job_id: str, steps: list[int], *, multi_attempt: bool
) -> list[MetricPoint]:
    p = MetricPoint
    rows: list[MetricPoint] = []
    for i in range(0, len(steps), _IN_CHUNK):
        chunk = steps[i : i + _IN_CHUNK]
        rows.extend(
            s.scalars(
                sa.select(p)
                .where(p.job_id == job_id, p.step.in_(chunk))
                .order_by(p.step, p.attempt.desc())
            ).all()
        )
    if not multi_attempt:
        return rows
    newest: dict[int, MetricPoint] = {}
    for r in rows:
        newest.setdefault(r.step, r)  # attempt descending: the first is the effective one
    return [newest[k] for k in sorted(newest)]


def _most_telling(rows: list[MetricPoint], n: int) -> list[MetricPoint]:
    """For ``n < 4``: the spike first, then the low, the last and the first point."""
    finite = [r for r in rows if r.loss is not None]
    order = []
    if finite:
        order += [
            max(finite, key=lambda r: r.loss or 0.0),
            min(finite, key=lambda r: r.loss or 0.0),
        ]
    order += [rows[-1], rows[0]]
    picked: list[MetricPoint] = []
    for r in order:
        if r not in picked:
            picked.append(r)
    return sorted(picked[:n], key=lambda r: r.step)


def _text(cursor: Cursor | None) -> str | None:
    return None if cursor is None else str(cursor)


def _row(r: MetricPoint, downsampled: bool) -> dict[str, Any]:
    return {**point_dict(r), "downsampled": downsampled}
