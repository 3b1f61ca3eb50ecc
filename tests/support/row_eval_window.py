"""The test oracle of :mod:`amptrain.store.history.eval_window`: its read from the per-value
rows (``metric_values``) as it was before the chunks, kept to prove the chunk read returns
the same. A job's evaluations (or per-layer gradient norms) in at most ``max_points``: the named
series of one kind downsampled in the database by the rules of the step metrics
(:mod:`amptrain.store.history.window`).

The steps from ``from_step`` to ``to_step`` fall into aligned buckets of one width of the
fixed ladder (:func:`~amptrain.store.history.window.width_for`, the one series_window
uses); per bucket the first and the last evaluation are kept and, for each metric name,
the evaluation holding its minimum and the one holding its maximum (a spike in accuracy or
eval loss survives any zoom). Layer norms, up to
:data:`~amptrain.contract.layers.LAYER_NORMS_MAX` names, keep per bucket the first, the
last and the step of the bucket's highest norm of any layer (a spike in any layer survives;
a minimum and maximum per layer would leave room for a few buckets only). A window that
holds at most ``max_points`` records comes back whole. Always the effective series (per
step and name, the newest attempt's value).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, aliased

from amptrain.contract.metrics import EVAL_KIND
from amptrain.store.history.eval_window import EvalWindow, most_telling, position
from amptrain.store.history.window import cursor_text, width_for
from tests.support.row_reads import newest_value_cursor as newest_cursor
from tests.support.row_sql import effective_value, eval_items, is_finite, steps_in
from tests.support.row_tables import MetricValue


def row_eval_window(
    s: Session,
    job_id: str,
    max_points: int,
    from_step: int | None = None,
    to_step: int | None = None,
    kind: str = EVAL_KIND,
) -> EvalWindow:
    """At most ``max_points`` ``kind`` records of steps ``from_step..to_step`` (default:
    all)."""
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    v = MetricValue
    where = [v.job_id == job_id, v.kind == kind, effective_value(v)]
    if from_step is not None:
        where.append(v.step >= from_step)
    if to_step is not None:
        where.append(v.step <= to_step)
    newest = cursor_text(newest_cursor(s, job_id, kind))
    records = sa.select(v.stream_ms).where(*where).group_by(v.stream_ms, v.stream_seq).subquery()
    count = s.scalar(sa.select(sa.func.count()).select_from(records)) or 0
    if count <= max_points:
        return EvalWindow(_items(s, where, downsampled=False), newest)
    lo, hi = s.execute(sa.select(sa.func.min(v.step), sa.func.max(v.step)).where(*where)).one()
    per_name = kind == EVAL_KIND
    names = list(s.scalars(sa.select(v.name).where(*where).distinct())) if per_name else []
    width = width_for(int(lo), int(hi), max_points, 2 + 2 * len(names) if per_name else 3)
    steps = _chosen_steps(s, job_id, kind, where, width, per_name)
    items: list[dict[str, Any]] = []
    for in_steps in steps_in(s, sorted(steps), v.step):
        items += _items(s, [*where, in_steps], downsampled=True)
    if len(items) > max_points:  # a budget below one bucket's share, or re-evaluated steps
        items = most_telling(items, max_points)
    return EvalWindow(sorted(items, key=position), newest)


def _chosen_steps(
    s: Session,
    job_id: str,
    kind: str,
    where: Sequence[sa.ColumnElement[bool]],
    width: int,
    per_name: bool,
) -> set[int]:
    """Per bucket: its first and last step and, per name, where its min and max are (not
    ``per_name``: where the bucket's max over every name is)."""
    v = MetricValue
    bucket = (v.step // width).label("bucket")
    value = sa.case((is_finite(v.value), v.value))
    # Not per name: one group per bucket, its "name" a constant the join ignores.
    name = v.name if per_name else sa.literal_column("''").label("name")
    agg = (
        sa.select(
            bucket,
            name,
            sa.func.min(v.step).label("first"),
            sa.func.max(v.step).label("last"),
            sa.func.min(value).label("low"),
            sa.func.max(value).label("high"),
        )
        .where(*where)
        .group_by(bucket, *([v.name] if per_name else []))
        .subquery()
    )
    q = aliased(MetricValue)
    same_name = q.name == agg.c.name if per_name else sa.true()
    query = (
        sa.select(
            sa.func.min(agg.c.first),
            sa.func.min(agg.c.last),
            sa.func.min(sa.case((q.value == agg.c.low, q.step))) if per_name else sa.null(),
            sa.func.min(sa.case((q.value == agg.c.high, q.step))),
        )
        .select_from(agg)
        .join(
            q,
            sa.and_(
                q.job_id == job_id,
                q.kind == kind,
                same_name,
                q.step.between(agg.c.first, agg.c.last),
                effective_value(q),
            ),
        )
        .group_by(agg.c.bucket, agg.c.name)
    )
    chosen: set[int] = set()
    firsts: dict[int, int] = {}
    lasts: dict[int, int] = {}
    for first, last, low, high in s.execute(query):
        b = int(first) // width
        firsts[b] = min(firsts.get(b, int(first)), int(first))
        lasts[b] = max(lasts.get(b, int(last)), int(last))
        chosen.update(int(x) for x in (low, high) if x is not None)
    return chosen | set(firsts.values()) | set(lasts.values())


def _items(
    s: Session, where: Sequence[sa.ColumnElement[bool]], *, downsampled: bool
) -> list[dict[str, Any]]:
    v = MetricValue
    rows = s.execute(
        sa.select(v.stream_ms, v.stream_seq, v.attempt, v.step, v.time, v.name, v.value)
        .where(*where)
        .order_by(v.step, v.stream_ms, v.stream_seq, v.id)
    ).all()
    items = eval_items(rows)
    for item in items:
        item["downsampled"] = downsampled
    return items
