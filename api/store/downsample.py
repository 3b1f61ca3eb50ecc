"""A run's metric series (or a window of its steps) in at most N points, computed by the
database, honest about spikes, NaN/Inf and skipped steps.

Per bucket of steps these points survive: the first and the last, the lowest and the
highest finite value of each requested field that can spike (:data:`EXTREMA_FIELDS`;
``loss`` and ``grad_norm`` when no fields are named), so a loss or grad-norm spike stays
visible at any zoom; and the first flagged step: skipped (``skipped`` true) or
non-finite (a ``loss`` that is null, NaN or infinite, a ``grad_norm`` that is NaN or
infinite). When the budget has room, every flagged step is kept; either way
:attr:`Window.marks` tells per bucket how many it holds, so nothing is dropped silently. A null loss counts as non-finite: SQLite
stores NaN as NULL, JSON has no NaN, and the engine always reports a loss.

Buckets are aligned to multiples of a width taken from a fixed ladder, so a growing run
keeps its buckets (and the points chosen in them) until it needs the next rung: a
refreshing chart does not jump. ``from_step``/``to_step`` restrict everything to a
window, which a zoomed chart fetches at full resolution when it fits.

The statements, none of which brings more than a few rows per bucket into Python:

1. ``min/max(step)``, ``count`` and the attempts of the window;
2. one GROUP BY bucket pass (first/last step, per field min/max of the finite values,
   flag counts, first flagged step), joined once more with the points to learn which
   step holds each min/max (the first such step on ties);
3. the flagged steps, only when a bucket holds more than one and they all fit;
4. the chosen rows by ``step IN (...)`` (index on (job_id, step)).

Retried jobs use the effective series (per step, the newest attempt's point), as
``GET /jobs/{id}/metrics`` does by default.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, aliased

from api.contracts.cursor import Cursor
from api.contracts.jsonsafe import finite
from api.store import summaries, summary_reads
from api.store.metrics import newest_attempt, newest_cursor, steps_in
from api.store.models import MetricPoint
from api.store.summary_layout import BASE, DBL_MAX, SUMMARY_FIELDS
from trainer_core.contract.records import METRIC_FIELDS, STORED_METRIC_FIELDS

EXTREMA_FIELDS = SUMMARY_FIELDS
"""The fields whose per-bucket min and max are kept when requested. ``lr`` follows a
smooth schedule and ``memory_reserved``/``memory_peak`` only step up, so a bucket's first
and last points already bound them; leaving them out keeps the pass over the points cheap."""
DEFAULT_EXTREMA = ("loss", "grad_norm")
"""Whose extremes are kept when a request names no fields."""
SUMMARY_WIDTH = 4 << BASE
"""From this bucket width on, buckets come from the summaries (below, the span is short)."""


def is_finite(column: Any) -> sa.ColumnElement[bool]:
    """A finite number on every backend: false for NULL, for SQLite's infinities and for
    PostgreSQL's NaN (which PostgreSQL sorts above every number) and infinities."""
    return sa.and_(column.is_not(None), column.between(-DBL_MAX, DBL_MAX))


def non_finite_loss(p: Any) -> sa.ColumnElement[bool]:
    return ~is_finite(p.loss)


def flagged(p: Any) -> sa.ColumnElement[bool]:
    """A skipped step, or one whose loss or grad norm is not a finite number."""
    bad_norm = sa.and_(p.grad_norm.is_not(None), ~is_finite(p.grad_norm))
    return sa.or_(p.skipped.is_(True), non_finite_loss(p), bad_norm)


@dataclass
class Window:
    items: list[dict[str, Any]]
    """Points in step order; each has ``downsampled`` (false: every point of the window)."""
    next_cursor: str | None
    """The newest recorded point's cursor (of the whole run): follow the run from there."""
    marks: list[dict[str, int]] = field(default_factory=list)
    """Buckets holding flagged steps: ``from_step``, ``to_step`` and how many steps there are
    ``flagged`` in all, ``skipped`` and ``non_finite`` (a step can be both)."""


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


def extrema_of(fields: Sequence[str] | None) -> tuple[str, ...]:
    """The fields whose per-bucket min and max a request keeps."""
    if fields is None:
        return DEFAULT_EXTREMA
    return tuple(f for f in fields if f in EXTREMA_FIELDS)


def downsample(
    s: Session, job_id: str, max_points: int, fields: Sequence[str] | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """The whole run in at most ``max_points`` points and the newest point's cursor."""
    window = series_window(s, job_id, max_points, fields)
    return window.items, window.next_cursor


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
    newest = _text(cursor)
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
        return Window([_row(r, False, fields) for r in rows], newest)
    lo, hi = total["first_step"], total["last_step"]
    extrema = extrema_of(fields)
    per_bucket = 3 + 2 * len(extrema)  # first, last, first flagged, each field's min and max
    width = _bucket_width(lo, hi, max(1, max_points // per_bucket))
    if width < SUMMARY_WIDTH:  # a short span: the points cost less than the nodes
        return raw_window(s, job_id, max_points, fields, from_step, to_step)
    ranges = [
        (max(lo, b * width), min(hi, b * width + width - 1))
        for b in range(lo // width, hi // width + 1)
    ]
    level = (width & -width).bit_length() - 1  # width = m * 2**level, m in 4..7
    steps, marks = _choose(summary_reads.aggregates(s, view, ranges, level, extrema), extrema)
    n_flagged = sum(m["flagged"] for m in marks)
    if n_flagged > len(marks) and len(steps) + n_flagged - len(marks) <= max_points:
        # Room for every flagged step, not just each bucket's first.
        steps |= summary_reads.flagged_steps(s, view, lo, hi, flagged(p))
    return _finish(s, job_id, steps, marks, max_points, extrema, fields, newest, multi=True)


def raw_window(
    s: Session,
    job_id: str,
    max_points: int,
    fields: Sequence[str] | None = None,
    from_step: int | None = None,
    to_step: int | None = None,
) -> Window:
    """:func:`series_window` computed from the points alone (GROUP BY in the database): for
    short spans and for jobs whose summaries do not hold every point."""
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
    newest = _text(newest_cursor(s, job_id))
    if not count:
        return Window([], newest)
    multi = first_attempt != last_attempt
    if multi:
        where.append(newest_attempt(p))
        count = s.scalar(sa.select(sa.func.count()).where(*where)) or 0  # effective points
    if count <= max_points:
        rows = s.scalars(sa.select(p).where(*where).order_by(p.step)).all()
        return Window([_row(r, False, fields) for r in rows], newest)
    extrema = extrema_of(fields)
    per_bucket = 3 + 2 * len(extrema)  # first, last, first flagged, each field's min and max
    width = _bucket_width(int(lo), int(hi), max(1, max_points // per_bucket))
    steps, marks = _chosen_steps(s, job_id, where, width, extrema, multi)
    n_flagged = sum(m["flagged"] for m in marks)
    if n_flagged > len(marks) and len(steps) + n_flagged - len(marks) <= max_points:
        # Room for every flagged step, not just each bucket's first.
        steps |= set(s.scalars(sa.select(p.step).where(*where, flagged(p))))
    return _finish(s, job_id, steps, marks, max_points, extrema, fields, newest, multi=multi)


def _finish(
    s: Session,
    job_id: str,
    steps: set[int],
    marks: list[dict[str, int]],
    max_points: int,
    extrema: tuple[str, ...],
    fields: Sequence[str] | None,
    newest: str | None,
    *,
    multi: bool,
) -> Window:
    """The chosen steps' rows as the window's items."""
    rows = _rows_at(s, job_id, sorted(steps), multi_attempt=multi)
    if len(rows) > max_points:  # only when max_points < per_bucket: one bucket
        rows = _most_telling(rows, max_points, extrema)
    items = [_row(r, True, fields) for r in rows]
    return Window(items, newest, marks)


def _choose(
    aggs: list[summaries.Agg], extrema: tuple[str, ...]
) -> tuple[set[int], list[dict[str, int]]]:
    """Per bucket's aggregates: the steps it keeps, and its mark when it holds flagged steps."""
    chosen: set[int] = set()
    marks: list[dict[str, int]] = []
    for a in aggs:
        if not a["points"]:
            continue
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


def _bucket_width(lo: int, hi: int, buckets: int) -> int:
    """The smallest width of the fixed ladder 1, 2, ..., 7, then m * 2**k for m in 4, 5, 6,
    7 (8, 10, 12, 14, 16, 20, ...; quarter-octave rungs, losing at most 25% of the
    resolution) such that steps lo..hi span at most ``buckets`` aligned buckets
    (``step // width``). A fixed ladder keeps a growing run's buckets until it needs the
    next rung; rungs of that form make every bucket of a width >= 2**(BASE+2) a union of
    aligned summary nodes of one level."""
    for width in _ladder():
        if hi // width - lo // width + 1 <= buckets:
            return width
    raise AssertionError("unreachable: the ladder is unbounded")


def _ladder() -> Iterator[int]:
    yield from range(1, 8)
    k = 1
    while True:
        for m in (4, 5, 6, 7):
            yield m << k
        k += 1


def _chosen_steps(
    s: Session,
    job_id: str,
    where: list[sa.ColumnElement[bool]],
    width: int,
    extrema: tuple[str, ...],
    multi: bool,
) -> tuple[set[int], list[dict[str, int]]]:
    """Per bucket: first, last, where each field's min/max is and the first flagged step;
    and the marks of the buckets holding flagged steps."""
    p = MetricPoint
    bucket = (p.step // width).label("bucket")
    columns: list[Any] = [
        bucket,
        sa.func.min(p.step).label("first"),
        sa.func.max(p.step).label("last"),
        sa.func.sum(sa.case((p.skipped.is_(True), 1), else_=0)).label("skipped"),
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
    marks: list[dict[str, int]] = []
    for first, last, skipped, non_finite, n_flagged, first_flag, *steps in s.execute(query):
        chosen.update((int(first), int(last)))
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
    return chosen, marks


def _rows_at(s: Session, job_id: str, steps: list[int], *, multi_attempt: bool) -> list[Any]:
    """The points at ``steps`` (the effective one per step), as rows: no ORM objects for
    what only becomes a dict."""
    p = MetricPoint
    rows: list[Any] = []
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


def _most_telling(rows: list[Any], n: int, extrema: tuple[str, ...]) -> list[Any]:
    """For a budget smaller than one bucket's points: each field's spike (highest value)
    first, then the flagged steps, the lows, the last and the first point."""
    highs: list[Any] = []
    lows: list[Any] = []
    for f in extrema:
        ranked = sorted((r for r in rows if _finite(getattr(r, f))), key=attrgetter(f))
        if ranked:
            highs.append(ranked[-1])
            lows.append(ranked[0])
    flags = [r for r in rows if r.skipped or not _finite(r.loss)]
    picked: list[Any] = []
    for r in [*highs, *flags, *lows, rows[-1], rows[0]]:
        if r not in picked:
            picked.append(r)
    return sorted(picked[:n], key=attrgetter("step"))


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _text(cursor: Cursor | None) -> str | None:
    return None if cursor is None else str(cursor)


def _row(r: Any, downsampled: bool, fields: Sequence[str] | None) -> dict[str, Any]:
    """A point (ORM object or row) as :func:`api.store.metrics.point_dict` shows it, only
    the wanted ``fields`` (:func:`select_fields`), plus ``downsampled``; numbers cleaned
    one by one, not by the recursive :func:`finite` (the hot loop of every history read)."""
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
