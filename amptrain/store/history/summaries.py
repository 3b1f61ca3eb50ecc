"""Multi-resolution summaries of a job's metric series, kept as its points are recorded, so a
downsampled history read costs the same at 10 thousand steps as at 10 million.

A node ``(level, idx)`` summarises the effective series (per step the newest attempt's
point) over the aligned steps ``[idx * 2**level, (idx + 1) * 2**level)``, for levels
:data:`BASE` .. ``top`` (``top`` = the bit length of the job's largest step, at least
BASE): how many points, the first and last step, how many are skipped, non-finite and
flagged (as :func:`amptrain.store.history.window.flagged` defines them), the first flagged step, and
per field of :data:`EXTREMA_FIELDS` the lowest and highest finite value with the first step
holding each. Nodes without points have no row.

This module holds the aggregates and reads the nodes; :mod:`amptrain.store.history.summary_writes` keeps
them as the recorder inserts points, and :mod:`amptrain.store.history.rebuild` recomputes a job
in SQL (for points written by other means, e.g. tests seeding millions of rows).

``metric_summary_state`` holds the cursor of the newest point the summaries hold: a read
uses them only when it equals the job's newest cursor, so points written without them
are never summarised wrongly, only read the slow way.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from math import isfinite
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.metrics import EXTREMA_FIELDS
from amptrain.store.history.layout import COLUMNS, COUNTS
from amptrain.store.history.points import steps_in
from amptrain.store.history.window import runs
from amptrain.store.models import MetricPoint, MetricSummary

_KEYS = tuple((f, f"{f}_min", f"{f}_min_step", f"{f}_max", f"{f}_max_step") for f in EXTREMA_FIELDS)
"""Per field its columns, spelled once: fold runs for every recorded point."""

Agg = dict[str, Any]
"""A node's aggregates, keyed as the table's columns (:data:`COLUMNS`)."""


# -- aggregates in Python --------------------------------------------------------------


def empty() -> Agg:
    agg: Agg = dict.fromkeys(COLUMNS)
    agg.update(points=0, skipped=0, non_finite=0, flagged=0)
    return agg


def is_finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def fold(agg: Agg, step: int, row: Mapping[str, Any]) -> None:
    """Add the point at ``step`` (after every step ``agg`` holds) to ``agg``."""
    if not agg["points"]:
        agg["first_step"] = step
    agg["points"] += 1
    agg["last_step"] = step
    skipped = bool(row.get("skipped"))
    non_finite = not is_finite(row.get("loss"))
    grad_norm = row.get("grad_norm")
    if skipped or non_finite or (grad_norm is not None and not is_finite(grad_norm)):
        agg["flagged"] += 1
        if agg["first_flag"] is None:
            agg["first_flag"] = step
    agg["skipped"] += skipped
    agg["non_finite"] += non_finite
    for f, lo, lo_step, hi, hi_step in _KEYS:
        v = row.get(f)
        if v is None or not isfinite(v):
            continue
        low = agg[lo]
        if low is None or v < low:
            agg[lo] = v
            agg[lo_step] = step
        high = agg[hi]
        if high is None or v > high:
            agg[hi] = v
            agg[hi_step] = step


def join(a: Agg | None, b: Agg | None, fields: Sequence[str] = EXTREMA_FIELDS) -> Agg:
    """The aggregates of two step ranges, ``a`` wholly before ``b`` (ties: ``a``'s step),
    with the extremes of ``fields``."""
    if a is None or not a["points"]:
        return dict(b) if b is not None else empty()
    if b is None or not b["points"]:
        return dict(a)
    out: Agg = {
        "points": a["points"] + b["points"],
        "first_step": a["first_step"],
        "last_step": b["last_step"],
        "skipped": a["skipped"] + b["skipped"],
        "non_finite": a["non_finite"] + b["non_finite"],
        "flagged": a["flagged"] + b["flagged"],
        "first_flag": a["first_flag"] if a["first_flag"] is not None else b["first_flag"],
    }
    for f in fields:
        lo, hi = f"{f}_min", f"{f}_max"
        src = a if a[lo] is not None and (b[lo] is None or a[lo] <= b[lo]) else b
        out[lo], out[f"{lo}_step"] = src[lo], src[f"{lo}_step"]
        src = a if a[hi] is not None and (b[hi] is None or a[hi] >= b[hi]) else b
        out[hi], out[f"{hi}_step"] = src[hi], src[f"{hi}_step"]
    return out


def effective(rows: Iterable[Any]) -> list[Any]:
    """Per step the newest attempt's row, in step order (rows ordered by step, attempt desc)."""
    out: list[Any] = []
    for r in rows:
        if not out or out[-1].step != r.step:
            out.append(r)
    return out


def raw_rows(s: Session, job_id: str, ranges: Sequence[tuple[int, int]]) -> list[Any]:
    """The effective points of the inclusive step ranges (a few steps each), in step order."""
    p = MetricPoint.__table__.c
    cols = [p.step, p.attempt, p.skipped, *(p[f] for f in EXTREMA_FIELDS)]
    return effective(points_at(s, job_id, ranges, cols))


def points_at(
    s: Session,
    job_id: str,
    ranges: Sequence[tuple[int, int]],
    cols: Sequence[Any],
    *where: Any,
) -> list[Any]:
    """``cols`` of every attempt's points in the step ranges (and ``where``), by step, newest
    attempt first. ``step IN (...)``, not an OR of ranges: SQLite scans the whole job for
    the latter."""
    p = MetricPoint
    steps = sorted({step for a, b in ranges for step in range(a, b + 1)})
    if not steps:
        return []  # a round trip saved per job and recorder pass
    out: list[Any] = []
    for in_steps in steps_in(s, steps):
        # stream_ms is in no index with attempt: SQLite then looks the steps up by
        # (job_id, step) instead of scanning the job's (job_id, attempt, step) entries,
        # the index that would otherwise "cover" the query.
        query = sa.select(*cols, p.stream_ms).where(p.job_id == job_id, in_steps, *where)
        out += s.execute(query).all()
    out.sort(key=lambda r: (r.step, -r.attempt))
    return out


def aggregate(rows: Iterable[Any]) -> Agg:
    agg = empty()
    for r in rows:
        fold(agg, r.step, r._mapping)
    return agg


# -- reading nodes ---------------------------------------------------------------------


def read_nodes(
    s: Session,
    job_id: str,
    keys: Iterable[tuple[int, int]],
    fields: Sequence[str] = EXTREMA_FIELDS,
) -> dict[tuple[int, int], Agg]:
    """The stored nodes among ``keys`` ((level, idx)) with the extremes of ``fields``, in one
    statement (contiguous indexes as one range each)."""
    by_level: dict[int, list[int]] = defaultdict(list)
    for level, idx in set(keys):
        by_level[level].append(idx)
    if not by_level:
        return {}
    m = MetricSummary
    names = [
        *COUNTS,
        *(f"{f}_{k}{x}" for f in fields for k in ("min", "max") for x in ("", "_step")),
    ]
    if s.get_bind().dialect.name == "sqlite":
        return _read_nodes_sqlite(s, job_id, by_level, names)
    # One round trip: PostgreSQL answers an OR of index conditions with one bitmap scan.
    where = sa.or_(*(_level_where(level, sorted(ids)) for level, ids in by_level.items()))
    cols = [m.level, m.idx, *(getattr(m, c) for c in names)]
    out: dict[tuple[int, int], Agg] = {}
    for lvl, idx, *values in s.execute(sa.select(*cols).where(m.job_id == job_id, where)):
        out[(lvl, idx)] = dict(zip(names, values, strict=True))
    return out


def read_job_nodes(
    s: Session, wanted: Mapping[str, Iterable[tuple[int, int]]]
) -> dict[str, dict[tuple[int, int], Agg]]:
    """Per job, the stored nodes among its ``wanted`` keys ((level, idx)), every field's
    extremes. On PostgreSQL one prepared statement for every job (the recorder's batch
    may hold hundreds, and a statement each was a third of its time there)."""
    if s.get_bind().dialect.name == "sqlite":
        return {job_id: read_nodes(s, job_id, keys) for job_id, keys in wanted.items()}
    keys = [(job_id, level, idx) for job_id, nodes in wanted.items() for level, idx in set(nodes)]
    out: dict[str, dict[tuple[int, int], Agg]] = {job_id: {} for job_id in wanted}
    if not keys:
        return out
    job_ids, levels, ids = (list(column) for column in zip(*keys, strict=True))
    conn: Any = s.connection().connection.driver_connection
    with conn.cursor() as cur:
        for job_id, level, idx, *values in cur.execute(_NODES_OF_JOBS, (job_ids, levels, ids)):
            out[job_id][(level, idx)] = dict(zip(COLUMNS, values, strict=True))
    return out


_NODES_OF_JOBS = (
    f"SELECT m.job_id, m.level, m.idx, {', '.join('m.' + c for c in COLUMNS)} "
    "FROM unnest(%s::text[], %s::int[], %s::int[]) AS k(job_id, level, idx) "
    "JOIN metric_summaries m ON m.job_id = k.job_id AND m.level = k.level AND m.idx = k.idx"
)


def _read_nodes_sqlite(
    s: Session, job_id: str, by_level: Mapping[int, list[int]], names: list[str]
) -> dict[tuple[int, int], Agg]:
    """SQLite: one index range per run of consecutive nodes, each through the driver's
    statement cache (no round trips to save; an OR of the ranges, or a UNION ALL, makes
    it walk every node of the job). The recorder reads ~20 ranges per batch here."""
    sql = (
        f"SELECT level, idx, {', '.join(names)} FROM metric_summaries "
        "WHERE job_id = ? AND level = ? AND idx BETWEEN ? AND ?"
    )
    conn: Any = s.connection().connection.driver_connection
    out: dict[tuple[int, int], Agg] = {}
    for level, ids in by_level.items():
        for first, last in runs(sorted(ids)):
            for lvl, idx, *values in conn.execute(sql, (job_id, level, first, last)):
                out[(lvl, idx)] = dict(zip(names, values, strict=True))
    return out


def _level_where(level: int, ids: list[int]) -> sa.ColumnElement[bool]:
    m = MetricSummary
    if ids[-1] - ids[0] + 1 == len(ids):
        return sa.and_(m.level == level, m.idx.between(ids[0], ids[-1]))
    return sa.and_(m.level == level, m.idx.in_(ids))
