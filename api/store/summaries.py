"""Multi-resolution summaries of a job's metric series, kept as its points are recorded, so a
downsampled history read costs the same at 10 thousand steps as at 10 million.

A node ``(level, idx)`` summarises the effective series (per step the newest attempt's
point) over the aligned steps ``[idx * 2**level, (idx + 1) * 2**level)``, for levels
:data:`BASE` .. ``top`` (``top`` = the bit length of the job's largest step, at least
BASE): how many points, the first and last step, how many are skipped, non-finite and
flagged (as :func:`api.store.window.flagged` defines them), the first flagged step, and
per field of :data:`SUMMARY_FIELDS` the lowest and highest finite value with the first step
holding each. Nodes without points have no row.

:func:`add_points` runs in the recorder's transaction with the points it just inserted: a
point past its node's last step folds in; one at or before it (a retry re-recording from
a checkpoint, a late replay of an older attempt) rebuilds that node from the raw points.
Parents are recomputed from their two children. :mod:`api.store.summary_rebuild` recomputes a job in SQL
(for points written by other means, e.g. tests seeding millions of rows).

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
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from api.store.metrics import steps_in
from api.store.models import MetricPoint, MetricSummary, MetricSummaryState
from api.store.summary_layout import BASE, COLUMNS, COUNTS, SUMMARY_FIELDS
from api.store.summary_rebuild import rebuild

_KEYS = tuple((f, f"{f}_min", f"{f}_min_step", f"{f}_max", f"{f}_max_step") for f in SUMMARY_FIELDS)
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


def join(a: Agg | None, b: Agg | None, fields: Sequence[str] = SUMMARY_FIELDS) -> Agg:
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
    p = MetricPoint
    cols = [p.step, p.attempt, p.skipped, *(getattr(p, f) for f in SUMMARY_FIELDS)]
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
    fields: Sequence[str] = SUMMARY_FIELDS,
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


def runs(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted ints as inclusive runs of consecutive values."""
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and runs[-1][1] + 1 == i:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


# -- recording -------------------------------------------------------------------------


def add_points(s: Session, job_id: str, points: Sequence[Mapping[str, Any]]) -> None:
    """Summarise points just inserted for ``job_id`` (dicts of MetricPoint columns), inside
    the transaction that inserted them."""
    if not points:
        return
    st = MetricSummaryState
    state = s.execute(
        sa.select(st.stream_ms, st.stream_seq, st.top).where(st.job_id == job_id)
    ).first()
    if state is None and _holds_other_points(s, job_id, len(points)):
        rebuild(s, job_id)  # points written without summaries: start from all of them
        return
    sqlite_nan = s.get_bind().dialect.name == "sqlite"  # SQLite stores NaN as NULL
    newest: dict[int, Mapping[str, Any]] = {}
    for p in points:
        old = newest.get(p["step"])
        if old is None or p["attempt"] > old["attempt"]:
            g = p.get("grad_norm")
            if sqlite_nan and g is not None and g != g:
                # A NaN grad norm is stored as NULL there: not a flagged step (a NaN loss
                # is non-finite either way; extremes skip both).
                p = {**p, "grad_norm": None}
            newest[p["step"]] = p
    old_top = state.top if state is not None else None
    top = max(BASE, max(newest).bit_length(), old_top or 0)
    by_node: dict[int, list[int]] = defaultdict(list)
    for step in sorted(newest):
        by_node[step >> BASE].append(step)
    paths = _paths(set(by_node), top)
    wanted = {(BASE, i) for i in by_node}
    for level in range(BASE, top):
        wanted |= {(level, i ^ 1) for i in paths[level]}
    if old_top is not None and top > old_top:
        wanted.add((old_top, 0))
    known = read_nodes(s, job_id, wanted)
    changed: dict[tuple[int, int], Agg] = {}
    if old_top is not None and top > old_top:
        # Every point lies below 2**old_top: the new levels' node 0 holds what it holds.
        for level in range(old_top + 1, top + 1):
            known[(level, 0)] = changed[(level, 0)] = dict(known[(old_top, 0)])
    stale = []
    for i, steps in by_node.items():
        node = known.get((BASE, i))
        if node is not None and steps[0] <= node["last_step"]:
            stale.append(i)  # the effective series changed inside the node
            continue
        node = dict(node) if node is not None else empty()
        for step in steps:
            fold(node, step, newest[step])
        known[(BASE, i)] = changed[(BASE, i)] = node
    unit = 1 << BASE
    rows = raw_rows(s, job_id, [(i * unit, i * unit + unit - 1) for i in stale])
    for i in stale:
        known[(BASE, i)] = changed[(BASE, i)] = aggregate(r for r in rows if r.step >> BASE == i)
    for level in range(BASE + 1, top + 1):
        for i in paths[level]:
            node = join(known.get((level - 1, 2 * i)), known.get((level - 1, 2 * i + 1)))
            known[(level, i)] = changed[(level, i)] = node
    _upsert_nodes(s, job_id, changed)
    ms, seq = max((p["stream_ms"], p["stream_seq"]) for p in points)
    if state is not None:
        ms, seq = max((ms, seq), (state.stream_ms, state.stream_seq))
    _upsert(
        s,
        MetricSummaryState,
        [{"job_id": job_id, "stream_ms": ms, "stream_seq": seq, "top": top}],
        ["job_id"],
    )


def _paths(base_ids: set[int], top: int) -> dict[int, set[int]]:
    """Per level, the nodes above the given base nodes (their ancestors up to ``top``)."""
    paths = {BASE: base_ids}
    for level in range(BASE + 1, top + 1):
        paths[level] = {i >> 1 for i in paths[level - 1]}
    return paths


def _holds_other_points(s: Session, job_id: str, n_new: int) -> bool:
    p = MetricPoint
    some = sa.select(p.id).where(p.job_id == job_id).limit(n_new + 1).subquery()
    return (s.scalar(sa.select(sa.func.count()).select_from(some)) or 0) > n_new


_NODE_COLUMNS = ("job_id", "level", "idx", *COLUMNS)
_UPSERT_NODE = (
    f"INSERT INTO metric_summaries ({', '.join(_NODE_COLUMNS)}) VALUES ({{marks}}) "
    f"ON CONFLICT (job_id, level, idx) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS)
)


def _upsert_nodes(s: Session, job_id: str, nodes: Mapping[tuple[int, int], Agg]) -> None:
    """One prepared statement, executemany on the driver's own connection (inside the
    session's transaction): SQLAlchemy's per-row parameter processing was most of the
    cost of keeping summaries."""
    if not nodes:
        return
    rows = [(job_id, k[0], k[1], *map(v.get, COLUMNS)) for k, v in nodes.items()]
    conn: Any = s.connection().connection.driver_connection
    if s.get_bind().dialect.name == "sqlite":
        conn.executemany(_UPSERT_NODE.format(marks=", ".join("?" * len(_NODE_COLUMNS))), rows)
        return
    with conn.cursor() as cur:
        cur.executemany(_UPSERT_NODE.format(marks=", ".join(["%s"] * len(_NODE_COLUMNS))), rows)


def _upsert(s: Session, model: type[Any], rows: list[dict[str, Any]], keys: list[str]) -> None:
    if not rows:
        return
    dialect = s.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(model.__table__)  # Core, not the ORM's bulk path: a third of the cost
    update = {c: stmt.excluded[c] for c in rows[0] if c not in keys}
    s.execute(stmt.on_conflict_do_update(index_elements=keys, set_=update), rows)
