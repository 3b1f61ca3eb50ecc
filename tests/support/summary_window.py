"""The second test oracle of the downsampled reads: the implementation that read the buckets
from ``metric_summaries`` (kept by :mod:`amptrain.store.history.summary_writes`) before
the reads came from the chunks' roll-ups, kept as it was so the summaries' own tests still
check what they promised; short spans and jobs without summaries from the points
(:mod:`tests.support.row_window`)."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.store.history import summaries, summary_reads
from amptrain.store.history.layout import BASE
from amptrain.store.history.window import (
    Window,
    cursor_text,
    extrema_of,
    flagged,
    room_for_every_flagged,
    window_width,
)
from amptrain.store.models import MetricPoint
from tests.support.row_points import point_row, row_finish
from tests.support.row_window import raw_window

SUMMARY_WIDTH = 4 << BASE
"""From this bucket width on, buckets come from the summaries (below, the span is short)."""


def series_window(
    s: Session,
    job_id: str,
    max_points: int,
    fields: Sequence[str] | None = None,
    from_step: int | None = None,
    to_step: int | None = None,
) -> Window:
    """At most ``max_points`` points of steps ``from_step..to_step`` (default: all), from the
    job's summaries when they hold every point (else :func:`raw_window`)."""
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    view, cursor = summary_reads.open_view(s, job_id)
    if view is None:
        return raw_window(s, job_id, max_points, fields, from_step, to_step)
    newest = cursor_text(cursor)
    first = 0 if from_step is None else from_step
    last = summary_reads.STEP_END if to_step is None else to_step
    (total,) = summary_reads.aggregates(s, view, [(first, last)], view.top)
    if not total["points"]:
        return Window([], newest)
    p = MetricPoint
    if total["points"] <= max_points:
        rows = summaries.effective(
            s.scalars(
                sa.select(p)
                .where(p.job_id == job_id, p.step.between(first, last))
                .order_by(p.step, p.attempt.desc())
            )
        )
        return Window([point_row(r, False, fields) for r in rows], newest)
    lo, hi = total["first_step"], total["last_step"]
    extrema = extrema_of(fields)
    width = window_width(lo, hi, max_points, extrema)
    if width < SUMMARY_WIDTH:  # a short span: the points cost less than the nodes
        return raw_window(s, job_id, max_points, fields, from_step, to_step)
    ranges = [
        (max(lo, b * width), min(hi, b * width + width - 1))
        for b in range(lo // width, hi // width + 1)
    ]
    level = (width & -width).bit_length() - 1  # width = m * 2**level, m in 4..7
    aggs = [a for a in summary_reads.aggregates(s, view, ranges, level, extrema) if a["points"]]
    steps, marks = _choose(aggs, extrema)
    if room_for_every_flagged(steps, marks, max_points):  # not just each bucket's first
        steps |= summary_reads.flagged_steps(s, view, lo, hi, flagged(p))
    lasts = {a["last_step"] for a in aggs}
    return row_finish(
        s, job_id, steps, lasts, marks, max_points, extrema, fields, newest, multi=True
    )


def _choose(
    aggs: list[summaries.Agg], extrema: tuple[str, ...]
) -> tuple[set[int], list[dict[str, int]]]:
    """Per bucket's aggregates (of buckets holding points): the steps it keeps, and its mark when it holds flagged steps."""
    chosen: set[int] = set()
    marks: list[dict[str, int]] = []
    for a in aggs:
        chosen.update((a["first_step"], a["last_step"]))
        for f in extrema:
            chosen.update(v for v in (a[f"{f}_min_step"], a[f"{f}_max_step"]) if v is not None)
        if a["first_flag"] is not None:
            chosen.add(a["first_flag"])
            marks.append(
                {
                    "from_step": a["first_step"],
                    "to_step": a["last_step"],
                    "flagged": a["flagged"],
                    "skipped": a["skipped"],
                    "non_finite": a["non_finite"],
                }
            )
    return chosen, marks
