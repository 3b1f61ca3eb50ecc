"""Reading a job's metric summaries (:mod:`amptrain.store.history.summaries`): the aggregates of any
step range from O(log) aligned nodes plus at most ``2**BASE - 1`` raw points at each end."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.cursor import Cursor
from amptrain.store.history.layout import BASE
from amptrain.store.history.summaries import (
    Agg,
    aggregate,
    effective,
    join,
    points_at,
    raw_rows,
    read_nodes,
)
from amptrain.store.models import MetricPoint, MetricSummary, MetricSummaryState

STEP_END = 2**31 - 1

Piece = tuple[str, int, int]
"""``("node", level, idx)`` or ``("raw", first_step, last_step)``."""


@dataclass(frozen=True)
class View:
    """A job's summaries, known to hold every point up to the job's newest cursor."""

    job_id: str
    top: int
    cursor: Cursor | None


def open_view(s: Session, job_id: str) -> tuple[View | None, Cursor | None]:
    """The job's newest cursor and, when its summaries hold that point, a view of them (one
    statement, one snapshot). None: points were written without summaries, or none yet."""
    p, st = MetricPoint, MetricSummaryState
    newest = (
        sa.select(p.stream_ms, p.stream_seq)
        .where(p.job_id == job_id)
        .order_by(p.stream_ms.desc(), p.stream_seq.desc())
        .limit(1)
        .subquery()
    )
    row = s.execute(
        sa.select(newest.c.stream_ms, newest.c.stream_seq, st.stream_ms, st.stream_seq, st.top)
        .select_from(newest)
        .outerjoin(st, st.job_id == job_id)
    ).first()
    if row is None:
        return None, None
    cursor = Cursor(row[0], row[1])
    if row[2] is None or (row[2], row[3]) != (row[0], row[1]):
        return None, cursor
    return View(job_id, int(row[4]), cursor), cursor


def cover(first: int, last: int, top: int) -> list[Piece]:
    """Steps ``first..last`` as the fewest aligned nodes of levels BASE..top and the raw
    edges (under ``2**BASE`` steps each), in step order."""
    unit = 1 << BASE
    start = -(-first // unit) * unit
    stop = (last + 1) // unit * unit  # exclusive
    if start >= stop:
        return [("raw", first, last)]
    pieces: list[Piece] = []
    if first < start:
        pieces.append(("raw", first, start - 1))
    x = start
    while x < stop:
        level = BASE
        while level < top and x % (2 << level) == 0 and x + (2 << level) <= stop:
            level += 1
        pieces.append(("node", level, x >> level))
        x += 1 << level
    if stop <= last:
        pieces.append(("raw", stop, last))
    return pieces


def aggregates(
    s: Session,
    view: View,
    ranges: list[tuple[int, int]],
    level: int,
    fields: Sequence[str] = (),
) -> list[Agg]:
    """The aggregates of each inclusive step range from nodes of levels up to ``level`` (a
    bucket of width m * 2**level is m nodes of that level: one contiguous run to read) and
    the raw points of the edges: nodes in one statement, the edges in another. Extremes:
    of ``fields`` only."""
    cap = min(level, view.top)
    covers = [cover(a, min(b, (1 << view.top) - 1), cap) for a, b in ranges]
    keys = [(p[1], p[2]) for c in covers for p in c if p[0] == "node"]
    edges = [(p[1], p[2]) for c in covers for p in c if p[0] == "raw" and p[1] <= p[2]]
    nodes = read_nodes(s, view.job_id, keys, fields)
    rows = raw_rows(s, view.job_id, edges)
    out = []
    for pieces in covers:
        agg: Agg | None = None
        for kind, a, b in pieces:
            if kind == "node":
                part = nodes.get((a, b))
            else:
                part = aggregate(r for r in rows if a <= r.step <= b)
            agg = join(agg, part, fields)
        out.append(agg if agg is not None else join(None, None))
    return out


def flagged_steps(s: Session, view: View, first: int, last: int, flag: Any) -> set[int]:
    """Every flagged step (``flag``: the condition on MetricPoint) of the effective series
    in ``first..last``: the base nodes holding flagged steps (a partial index holds just
    those), their points looked up by step, then the newest attempt of each hit decides."""
    m, p = MetricSummary.__table__.c, MetricPoint
    unit = 1 << BASE
    hits = [
        r
        for r in s.execute(
            sa.select(p.step, p.attempt)
            .select_from(MetricSummary)
            .join(
                p,
                sa.and_(
                    p.job_id == m.job_id,
                    p.step.between(m.idx * unit, m.idx * unit + unit - 1),
                ),
            )
            .where(
                m.job_id == view.job_id,
                m.level == BASE,
                m.idx.between(first >> BASE, last >> BASE),
                m.flagged > sa.literal_column("0"),  # as written: the partial index's condition
                flag,
            )
        )
        # Clipped here, not in SQL: a step range there invites the planner to walk the
        # points of the window instead of the few flagged nodes.
        if first <= r.step <= last
    ]
    if not hits:
        return set()
    # A newer attempt's point at the same step (flagged or not) decides.
    steps = [(r.step, r.step) for r in hits]
    newest = {
        r.step: r.attempt for r in effective(points_at(s, view.job_id, steps, [p.step, p.attempt]))
    }
    return {r.step for r in hits if newest[r.step] == r.attempt}
