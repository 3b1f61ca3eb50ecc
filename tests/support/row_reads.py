"""The cursor reads as the per-value rows served them before the chunks did (issue 41):
the oracle the chunk reads must equal byte for byte (tests/store/history/test_chunk_pages.py).
Moved here verbatim from amptrain/store/history/points.py and values.py."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.cursor import Cursor
from amptrain.contract.metrics import EVAL_KIND
from amptrain.store.history.points import FIRST, Page
from tests.support.row_sql import bounds, effective_value, eval_items, newest_attempt, point_dict
from tests.support.row_tables import MetricPoint, MetricValue


def metric_page(
    s: Session, job_id: str, page: Page = FIRST
) -> tuple[list[dict[str, Any]], str | None]:
    """The points of ``page`` in recording order, as dicts of STORED_METRIC_FIELDS +
    ``attempt`` + ``cursor``; ``effective`` keeps, for each step, only the newest attempt's
    point (the series after a resume), ``all`` every attempt's. And ``next_cursor``
    (:meth:`Page.next_cursor`)."""
    p = MetricPoint
    query = sa.select(p).where(p.job_id == job_id, *bounds(page, p))
    if page.effective:
        query = query.where(newest_attempt(p))
    rows = s.scalars(query.order_by(p.stream_ms, p.stream_seq).limit(page.limit)).all()
    items = [point_dict(r) for r in rows]
    return items, page.next_cursor(items)


def newest_cursor(
    s: Session,
    job_id: str,
    table: type[MetricPoint] | type[MetricValue] = MetricPoint,
    *where: sa.ColumnElement[bool],
) -> Cursor | None:
    """The cursor of the job's most recently recorded row of ``table`` (a point, or a named
    series' value) that meets ``where``; None before the first."""
    row = s.execute(
        sa.select(table.stream_ms, table.stream_seq)
        .where(table.job_id == job_id, *where)
        .order_by(table.stream_ms.desc(), table.stream_seq.desc())
        .limit(1)
    ).first()
    return Cursor(row[0], row[1]) if row else None


def recorded_through(s: Session, job_id: str) -> dict[int, int]:
    """Per attempt, the newest step of its points in SQL. An attempt's records reach the
    stream in step order and the recorder commits in stream order, so every step of the
    attempt up to it (from the checkpoint it resumed from) is recorded."""
    p = MetricPoint
    rows = s.execute(
        sa.select(p.attempt, sa.func.max(p.step)).where(p.job_id == job_id).group_by(p.attempt)
    )
    return {int(attempt): int(step) for attempt, step in rows}


def eval_page(
    s: Session, job_id: str, page: Page = FIRST, kind: str = EVAL_KIND
) -> tuple[list[dict[str, Any]], str | None]:
    """The ``kind`` records of ``page`` (whole records: up to ``limit`` of them) in recording
    order. ``effective`` keeps, per step and name, only the newest attempt's value (a record
    whose every value was re-evaluated by a newer attempt disappears); ``all`` keeps every
    attempt's. ``next_cursor`` as for the metric points (:meth:`Page.next_cursor`)."""
    v = MetricValue
    where = [v.job_id == job_id, v.kind == kind, *bounds(page, v)]
    if page.effective:
        where.append(effective_value(v))
    # The page's last record first, then every row up to it: whole records only.
    cursors = (
        sa.select(v.stream_ms, v.stream_seq)
        .where(*where)
        .group_by(v.stream_ms, v.stream_seq)
        .order_by(v.stream_ms, v.stream_seq)
        .limit(page.limit)
        .subquery()
    )
    last = s.execute(
        sa.select(cursors.c.stream_ms, cursors.c.stream_seq)
        .order_by(cursors.c.stream_ms.desc(), cursors.c.stream_seq.desc())
        .limit(1)
    ).first()
    if last is None:
        return [], page.next_cursor([])
    rows = s.execute(
        sa.select(v.stream_ms, v.stream_seq, v.attempt, v.step, v.time, v.name, v.value)
        .where(*where, sa.tuple_(v.stream_ms, v.stream_seq) <= sa.tuple_(last[0], last[1]))
        .order_by(v.stream_ms, v.stream_seq, v.id)
    ).all()
    items = eval_items(rows)
    return items, page.next_cursor(items)


def newest_record_size(s: Session, job_id: str, kind: str = EVAL_KIND) -> int:
    """How many named values the job's newest ``kind`` record holds (its layers, for layer
    norms); 0 before the first. Two index reads, whatever the run's length."""
    cursor = newest_value_cursor(s, job_id, kind)
    if cursor is None:
        return 0
    v = MetricValue
    count = sa.select(sa.func.count()).where(
        v.job_id == job_id, v.stream_ms == cursor.ms, v.stream_seq == cursor.seq, v.kind == kind
    )
    return int(s.execute(count).scalar_one())


def newest_value_cursor(s: Session, job_id: str, kind: str = EVAL_KIND) -> Cursor | None:
    """The cursor of the job's most recently recorded ``kind`` record (None before the first)."""
    return newest_cursor(s, job_id, MetricValue, MetricValue.kind == kind)
