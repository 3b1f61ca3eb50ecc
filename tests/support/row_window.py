"""The test oracle of the downsampled reads: a window computed from the metric points alone
(one GROUP BY bucket pass in the database), the implementation ``GET /jobs/{id}/metrics``
used before the reads came from the chunks' roll-ups (and, for short spans and jobs
without summaries, before that). The chunk reader must return what this returns, byte for
byte, for the same recorded run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, aliased

from amptrain.store.history.window import (
    Window,
    cursor_text,
    extrema_of,
    room_for_every_flagged,
    window_width,
)
from tests.support.row_points import point_row, row_finish
from tests.support.row_reads import newest_cursor
from tests.support.row_sql import flagged, is_finite, newest_attempt, non_finite_loss
from tests.support.row_tables import MetricPoint


def raw_window(
    s: Session,
    job_id: str,
    max_points: int,
    fields: Sequence[str] | None = None,
    from_step: int | None = None,
    to_step: int | None = None,
) -> Window:
    """:func:`amptrain.store.history.downsample.series_window` computed from the points alone
    (GROUP BY in the database)."""
    p = MetricPoint
    where = [p.job_id == job_id]
    if from_step is not None:
        where.append(p.step >= from_step)
    if to_step is not None:
        where.append(p.step <= to_step)
    lo, hi, count, first_attempt, last_attempt = s.execute(
        sa.select(
            sa.func.min(p.step),
            sa.func.max(p.step),
            sa.func.count(),
            sa.func.min(p.attempt),
            sa.func.max(p.attempt),
        ).where(*where)
    ).one()
    newest = cursor_text(newest_cursor(s, job_id))
    if not count:
        return Window([], newest)
    multi = first_attempt != last_attempt
    if multi:
        where.append(newest_attempt(p))
        count = s.scalar(sa.select(sa.func.count()).where(*where)) or 0  # effective points
    if count <= max_points:
        rows = s.scalars(sa.select(p).where(*where).order_by(p.step)).all()
        return Window([point_row(r, False, fields) for r in rows], newest)
    extrema = extrema_of(fields)
    width = window_width(int(lo), int(hi), max_points, extrema)
    steps, lasts, marks = _chosen_steps(s, job_id, where, width, extrema, multi)
    if room_for_every_flagged(steps, marks, max_points):  # not just each bucket's first
        steps |= set(s.scalars(sa.select(p.step).where(*where, flagged(p))))
    return row_finish(
        s, job_id, steps, lasts, marks, max_points, extrema, fields, newest, multi=multi
    )


def _chosen_steps(
    s: Session,
    job_id: str,
    where: list[sa.ColumnElement[bool]],
    width: int,
    extrema: tuple[str, ...],
    multi: bool,
) -> tuple[set[int], set[int], list[dict[str, int]]]:
    """Per bucket: first, last, where each field's min/max is and the first flagged step;
    each bucket's last step; and the marks of the buckets holding flagged steps."""
    p = MetricPoint
    bucket = (p.step // width).label("bucket")
    columns: list[Any] = [
        bucket,
        sa.func.min(p.step).label("first"),
        sa.func.max(p.step).label("last"),
        sa.func.sum(sa.case((p.__table__.c.skipped.is_(True), 1), else_=0)).label("skipped"),
        sa.func.sum(sa.case((non_finite_loss(p), 1), else_=0)).label("non_finite"),
        sa.func.sum(sa.case((flagged(p), 1), else_=0)).label("flagged"),
        sa.func.min(sa.case((flagged(p), p.step))).label("first_flag"),
    ]
    for f in extrema:
        value = sa.case((is_finite(getattr(p, f)), getattr(p, f)))
        columns += [sa.func.min(value).label(f"low_{f}"), sa.func.max(value).label(f"high_{f}")]
    agg = sa.select(*columns).where(*where).group_by(bucket).subquery()
    q = aliased(MetricPoint)
    which: list[Any] = []
    for f in extrema:
        col = getattr(q, f)
        which += [
            sa.func.min(sa.case((col == agg.c[f"low_{f}"], q.step))),
            sa.func.min(sa.case((col == agg.c[f"high_{f}"], q.step))),
        ]
    outer = (
        agg.c.first,
        agg.c.last,
        agg.c.skipped,
        agg.c.non_finite,
        agg.c.flagged,
        agg.c.first_flag,
    )
    if extrema:
        # One row per bucket (min() of a per-bucket constant is that constant): grouping
        # by the bucket alone spares the database a sort over every joined row.
        query = (
            sa.select(*[sa.func.min(c) for c in outer], *which)
            .select_from(agg)
            .join(q, sa.and_(q.job_id == job_id, q.step.between(agg.c.first, agg.c.last)))
            .group_by(agg.c.bucket)
        )
        if multi:
            query = query.where(newest_attempt(q))
    else:
        query = sa.select(*outer)
    chosen: set[int] = set()
    lasts: set[int] = set()
    marks: list[dict[str, int]] = []
    for first, last, skipped, non_finite, n_flagged, first_flag, *steps in s.execute(query):
        chosen.update((int(first), int(last)))
        lasts.add(int(last))
        chosen.update(int(v) for v in steps if v is not None)
        if first_flag is not None:
            chosen.add(int(first_flag))
            marks.append(
                {
                    "from_step": int(first),
                    "to_step": int(last),
                    "flagged": int(n_flagged),
                    "skipped": int(skipped or 0),
                    "non_finite": int(non_finite or 0),
                }
            )
    marks.sort(key=lambda m: m["from_step"])
    return chosen, lasts, marks
