"""The SQL pieces of the row reads (the oracles' reads of :mod:`tests.support.row_tables`),
moved here verbatim from amptrain/store/history/points.py, values.py and window.py when the
product's row tables went (migration 0017)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session, aliased

from amptrain.contract.cursor import Cursor
from amptrain.contract.metrics import STORED_METRIC_FIELDS
from amptrain.store.history.points import Page
from tests.support.row_tables import MetricPoint, MetricValue

DBL_MAX = 1.7976931348623157e308
"""The largest finite double: ``BETWEEN -DBL_MAX AND DBL_MAX`` is "finite" in SQL on both
databases (false for NULL, NaN and the infinities)."""
IN_CHUNK = 2000
"""Steps per ``IN (...)`` on SQLite: bound parameters far below its limit of 32766."""


def steps_in(
    s: Session, steps: Sequence[int], column: Any = MetricPoint.step
) -> Iterator[sa.ColumnElement[bool]]:
    """Conditions that together select the rows at ``steps`` (of ``column``: the points' by
    default): on PostgreSQL one ``step = ANY(array)``, else ``IN`` chunks."""
    if s.get_bind().dialect.name == "postgresql":
        yield column == sa.any_(sa.bindparam("steps", list(steps), postgresql.ARRAY(sa.Integer)))
        return
    for i in range(0, len(steps), IN_CHUNK):
        yield column.in_(steps[i : i + IN_CHUNK])


def bounds(page: Page, table: Any) -> list[sa.ColumnElement[bool]]:
    """The conditions on ``table``'s cursor columns that keep the page's stretch."""
    pos = sa.tuple_(table.stream_ms, table.stream_seq)
    where = []
    if page.start is not None:
        where.append(pos > sa.tuple_(*page.start))
    if page.upto is not None:
        where.append(pos <= sa.tuple_(*page.upto))
    return where


def newest_attempt(p: Any) -> sa.ColumnElement[bool]:
    """True for the point of ``p`` (MetricPoint or an alias) no newer attempt has re-recorded."""
    newer = aliased(MetricPoint)
    return ~sa.exists().where(
        newer.job_id == p.job_id, newer.step == p.step, newer.attempt > p.attempt
    )


def point_dict(row: MetricPoint) -> dict[str, Any]:
    """A recorded point as the API shows it: STORED_METRIC_FIELDS + ``attempt`` + ``cursor``."""
    out: dict[str, Any] = {f: getattr(row, f) for f in STORED_METRIC_FIELDS}
    out["attempt"] = row.attempt
    out["cursor"] = str(Cursor(row.stream_ms, row.stream_seq))
    return out


def effective_value(v: Any) -> sa.ColumnElement[bool]:
    """True for the value of ``v`` (MetricValue or an alias) that no newer attempt has
    re-evaluated: per step and name, the newest attempt's."""
    newer = aliased(MetricValue)
    newest = (
        sa.select(sa.func.max(newer.attempt))
        .where(
            newer.job_id == v.job_id,
            newer.kind == v.kind,
            newer.name == v.name,
            newer.step == v.step,
        )
        .scalar_subquery()
    )
    return v.attempt == newest


def eval_items(rows: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
    """Value rows ``(stream_ms, stream_seq, attempt, step, time, name, value)``, each
    record's together, as one item per eval record."""
    items: list[dict[str, Any]] = []
    for ms, seq, attempt, step, time, name, value in rows:
        cursor = str(Cursor(ms, seq))
        if not items or items[-1]["cursor"] != cursor:
            items.append(
                {"step": step, "attempt": attempt, "time": time, "cursor": cursor, "values": {}}
            )
        items[-1]["values"][name] = value
    return items


def is_finite(column: Any) -> sa.ColumnElement[bool]:
    """A finite number on every backend: false for NULL, for SQLite's infinities and for
    PostgreSQL's NaN (which PostgreSQL sorts above every number) and infinities."""
    return sa.and_(column.is_not(None), column.between(-DBL_MAX, DBL_MAX))


def non_finite_loss(p: Any) -> sa.ColumnElement[bool]:
    return ~is_finite(p.loss)


def flagged(p: Any) -> sa.ColumnElement[bool]:
    """A skipped step, or one whose loss or grad norm is not a finite number (the rows'
    form of :func:`amptrain.store.history.rollups.step_flags`)."""
    bad_norm = sa.and_(p.grad_norm.is_not(None), ~is_finite(p.grad_norm))
    return sa.or_(p.skipped.is_(True), non_finite_loss(p), bad_norm)
