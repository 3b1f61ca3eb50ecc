"""The chosen steps' items of a downsampled read as the test oracles
(:mod:`tests.support.row_window`) takes them: from the
rows of ``metric_points``, cleaned one by one, exactly as the reads did before the items
came from the chunks (:func:`amptrain.store.history.chunk_pages.window_at`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from amptrain.contract.cursor import Cursor
from amptrain.contract.jsonsafe import finite
from amptrain.contract.metrics import STORED_METRIC_FIELDS
from amptrain.store.history.window import Window, finish, needed
from tests.support.row_sql import steps_in
from tests.support.row_tables import MetricPoint


def row_finish(
    s: Session,
    job_id: str,
    steps: set[int],
    lasts: set[int],
    marks: list[dict[str, int]],
    max_points: int,
    extrema: tuple[str, ...],
    fields: Sequence[str] | None,
    newest: str | None,
    *,
    multi: bool,
) -> Window:
    """:func:`amptrain.store.history.window.finish` of the chosen steps' rows."""
    rows = rows_at(s, job_id, sorted(steps), multi_attempt=multi)
    items = [point_row(r, True, needed(fields, extrema)) for r in rows]
    return finish(items, lasts, marks, max_points, extrema, fields, newest)


def rows_at(s: Session, job_id: str, steps: list[int], *, multi_attempt: bool) -> list[Any]:
    """The points at ``steps`` (the effective one per step), as rows."""
    p = MetricPoint
    rows: list[Any] = []
    if s.get_bind().dialect.name == "postgresql":
        # One index lookup per step (LATERAL), whatever the planner knows.
        k = sa.func.unnest(sa.bindparam("steps", steps, postgresql.ARRAY(sa.Integer)))
        wanted = sa.select(k.column_valued("step")).subquery("k")
        lookup = (
            sa.select(p.__table__).where(p.job_id == job_id, p.step == wanted.c.step).lateral("p")
        )
        rows = list(
            s.execute(
                sa.select(lookup)
                .select_from(wanted.join(lookup, sa.true()))
                .order_by(lookup.c.step, lookup.c.attempt.desc())
            )
        )
    else:
        for in_steps in steps_in(s, steps):
            rows.extend(
                s.execute(
                    sa.select(p.__table__)
                    .where(p.job_id == job_id, in_steps)
                    .order_by(p.step, p.attempt.desc())
                ).all()
            )
    if not multi_attempt:
        return rows
    newest: dict[int, Any] = {}
    for r in rows:
        newest.setdefault(r.step, r)  # attempt descending: the first is the effective one
    return [newest[k] for k in sorted(newest)]


def point_row(r: Any, downsampled: bool, fields: Sequence[str] | None) -> dict[str, Any]:
    """A point (ORM object or row) as a window's item: only the wanted ``fields``, plus
    ``downsampled``; non-finite numbers null."""
    names = (
        STORED_METRIC_FIELDS
        if fields is None
        else [f for f in STORED_METRIC_FIELDS if f in {"step", *fields}]
    )
    out: dict[str, Any] = {}
    for f in names:
        v = getattr(r, f)
        if v.__class__ is float:
            # PostgreSQL keeps NaN and infinities; JSON (and browsers) cannot carry them.
            v = v if math.isfinite(v) else None
        elif isinstance(v, list | dict):
            v = finite(v)
        out[f] = v
    out["attempt"] = r.attempt
    out["cursor"] = str(Cursor(r.stream_ms, r.stream_seq))
    out["downsampled"] = downsampled
    return out
