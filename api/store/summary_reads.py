"""Reading a job's metric summaries (:mod:`api.store.summaries`): the aggregates of any
step range from O(log) aligned nodes plus at most ``2**BASE - 1`` raw points at each end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from api.contracts.cursor import Cursor
from api.store.models import MetricPoint, MetricSummary, MetricSummaryState
from api.store.summaries import (
    BASE,
    Agg,
    aggregate,
    effective,
    join,
    raw_rows,
    read_nodes,
    runs,
)

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
    """Steps ``first..last`` as aligned nodes of levels BASE..top and raw edges, in order."""
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


def aggregates(s: Session, view: View, ranges: list[tuple[int, int]]) -> list[Agg]:
    """The aggregates of each inclusive step range: nodes in one statement, the raw edges
    in another."""
    covers = [cover(a, min(b, (1 << view.top) - 1), view.top) for a, b in ranges]
    keys = [(p[1], p[2]) for c in covers for p in c if p[0] == "node"]
    edges = [(p[1], p[2]) for c in covers for p in c if p[0] == "raw"]
    nodes = read_nodes(s, view.job_id, keys)
    rows = raw_rows(s, view.job_id, edges)
    out = []
    for pieces in covers:
        agg: Agg | None = None
        for kind, a, b in pieces:
            if kind == "node":
                part = nodes.get((a, b))
            else:
                part = aggregate(r for r in rows if a <= r.step <= b)
            agg = join(agg, part)
        out.append(agg if agg is not None else join(None, None))
    return out


def flagged_steps(s: Session, view: View, first: int, last: int, flag: Any) -> set[int]:
    """Every flagged step (``flag``: the condition) of the effective series in
    ``first..last``: found through the base nodes holding flagged steps, then read from
    those nodes' points (every attempt's: the newest per step decides)."""
    m = MetricSummary
    ids = s.scalars(
        sa.select(m.idx).where(
            m.job_id == view.job_id,
            m.level == BASE,
            m.idx.between(first >> BASE, last >> BASE),
            m.flagged > 0,
        )
    ).all()
    unit = 1 << BASE
    ranges = [(max(first, a * unit), min(last, b * unit + unit - 1)) for a, b in runs(sorted(ids))]
    p = MetricPoint
    rows: list[Any] = []
    for i in range(0, len(ranges), 200):
        chunk = ranges[i : i + 200]
        rows += s.execute(
            sa.select(p.step, p.attempt, flag.label("flag")).where(
                p.job_id == view.job_id, sa.or_(*(p.step.between(a, b) for a, b in chunk))
            )
        ).all()
    rows.sort(key=lambda r: (r.step, -r.attempt))
    return {r.step for r in effective(rows) if r.flag}
