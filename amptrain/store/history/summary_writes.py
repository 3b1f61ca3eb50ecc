"""Keeping the metric summaries (:mod:`amptrain.store.history.summaries`) as points are recorded.

:func:`add_points` runs in the recorder's transaction with the points it just inserted,
for every job of the batch at once: one read of the jobs' summary states, the nodes each
job's points touch, then one upsert of every changed node and one of every state. Per job
statements were most of the recorder's cost with hundreds of busy jobs (~50 points each
a pass).

A point past its node's last step folds in; one at or before it (a retry re-recording
from a checkpoint, a late replay of an older attempt) rebuilds that node from the raw
points. Parents are recomputed from their two children. A job whose points were written
without summaries (no state row, other points present) is rebuilt in SQL instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.store.history.layout import BASE, COLUMNS
from amptrain.store.history.rebuild import rebuild
from amptrain.store.history.summaries import (
    Agg,
    aggregate,
    empty,
    fold,
    join,
    raw_rows,
    read_job_nodes,
)
from amptrain.store.models import MetricPoint, MetricSummaryState

Points = Sequence[Mapping[str, Any]]
"""Points as dicts of MetricPoint columns, of one job."""


class State(NamedTuple):
    """A job's ``metric_summary_state`` row: the newest cursor the summaries hold, top level."""

    stream_ms: int
    stream_seq: int
    top: int


class _Plan(NamedTuple):
    """One job's part of a batch: its new points by step and the nodes they touch."""

    newest: dict[int, Mapping[str, Any]]
    state: State | None
    top: int
    by_node: dict[int, list[int]]  # base node index -> its new steps, ascending
    paths: dict[int, set[int]]  # level -> the nodes above the new points


def add_points(s: Session, batches: Mapping[str, Points]) -> None:
    """Summarise the points just inserted, per job (``job_id -> points``), inside the
    transaction that inserted them."""
    batches = {job_id: points for job_id, points in batches.items() if points}
    if not batches:
        return
    states = _read_states(s, list(batches))
    sqlite_nan = s.get_bind().dialect.name == "sqlite"  # SQLite stores NaN as NULL
    plans: dict[str, _Plan] = {}
    for job_id, points in batches.items():
        state = states.get(job_id)
        if state is None and _holds_other_points(s, job_id, len(points)):
            rebuild(s, job_id)  # points written without summaries: start from all of them
        else:
            plans[job_id] = _plan(_newest(points, sqlite_nan), state)
    known = read_job_nodes(s, {job_id: _wanted(plan) for job_id, plan in plans.items()})
    nodes: list[tuple[Any, ...]] = []
    new_states: list[tuple[str, int, int, int]] = []
    for job_id, plan in plans.items():
        changed = _fold_job(s, job_id, plan, known[job_id])
        nodes += [(job_id, *key, *map(agg.get, COLUMNS)) for key, agg in changed.items()]
        ms, seq = max((p["stream_ms"], p["stream_seq"]) for p in batches[job_id])
        if plan.state is not None:
            ms, seq = max((ms, seq), (plan.state.stream_ms, plan.state.stream_seq))
        new_states.append((job_id, ms, seq, plan.top))
    _executemany(s, _UPSERT_NODE, len(_NODE_COLUMNS), nodes)
    _executemany(s, _UPSERT_STATE, len(_STATE_COLUMNS), new_states)


def _newest(points: Points, sqlite_nan: bool) -> dict[int, Mapping[str, Any]]:
    """Per step the newest attempt's point among ``points``."""
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
    return newest


def _plan(newest: dict[int, Mapping[str, Any]], state: State | None) -> _Plan:
    old_top = state.top if state is not None else 0
    top = max(BASE, max(newest).bit_length(), old_top)
    by_node: dict[int, list[int]] = defaultdict(list)
    for step in sorted(newest):
        by_node[step >> BASE].append(step)
    return _Plan(newest, state, top, by_node, _paths(set(by_node), top))


def _wanted(plan: _Plan) -> set[tuple[int, int]]:
    """The stored nodes folding ``plan`` needs: its base nodes, every sibling on the way
    up, and the old root when the tree grows."""
    wanted = {(BASE, i) for i in plan.by_node}
    for level in range(BASE, plan.top):
        wanted |= {(level, i ^ 1) for i in plan.paths[level]}
    if plan.state is not None and plan.top > plan.state.top:
        wanted.add((plan.state.top, 0))
    return wanted


def _fold_job(
    s: Session, job_id: str, plan: _Plan, known: dict[tuple[int, int], Agg]
) -> dict[tuple[int, int], Agg]:
    """The nodes of one job that its plan changes (``known``: the stored nodes it wanted)."""
    changed: dict[tuple[int, int], Agg] = {}
    if plan.state is not None and plan.top > plan.state.top:
        # Every point lies below 2**old_top: the new levels' node 0 holds what it holds.
        for level in range(plan.state.top + 1, plan.top + 1):
            known[(level, 0)] = changed[(level, 0)] = dict(known[(plan.state.top, 0)])
    stale = []
    for i, steps in plan.by_node.items():
        node = known.get((BASE, i))
        if node is not None and steps[0] <= node["last_step"]:
            stale.append(i)  # the effective series changed inside the node
            continue
        node = dict(node) if node is not None else empty()
        for step in steps:
            fold(node, step, plan.newest[step])
        known[(BASE, i)] = changed[(BASE, i)] = node
    unit = 1 << BASE
    rows = raw_rows(s, job_id, [(i * unit, i * unit + unit - 1) for i in stale])
    for i in stale:
        known[(BASE, i)] = changed[(BASE, i)] = aggregate(r for r in rows if r.step >> BASE == i)
    for level in range(BASE + 1, plan.top + 1):
        for i in plan.paths[level]:
            node = join(known.get((level - 1, 2 * i)), known.get((level - 1, 2 * i + 1)))
            known[(level, i)] = changed[(level, i)] = node
    return changed


def _paths(base_ids: set[int], top: int) -> dict[int, set[int]]:
    """Per level, the nodes above the given base nodes (their ancestors up to ``top``)."""
    paths = {BASE: base_ids}
    for level in range(BASE + 1, top + 1):
        paths[level] = {i >> 1 for i in paths[level - 1]}
    return paths


def _read_states(s: Session, job_ids: list[str]) -> dict[str, State]:
    st = MetricSummaryState
    query = sa.select(st.job_id, st.stream_ms, st.stream_seq, st.top).where(st.job_id.in_(job_ids))
    return {job_id: State(*rest) for job_id, *rest in s.execute(query)}


def _holds_other_points(s: Session, job_id: str, n_new: int) -> bool:
    p = MetricPoint
    some = sa.select(p.id).where(p.job_id == job_id).limit(n_new + 1).subquery()
    return (s.scalar(sa.select(sa.func.count()).select_from(some)) or 0) > n_new


def _upsert_sql(table: str, keys: tuple[str, ...], values: tuple[str, ...]) -> str:
    return (
        f"INSERT INTO {table} ({', '.join((*keys, *values))}) VALUES ({{marks}}) "
        f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET "
        + ", ".join(f"{c} = excluded.{c}" for c in values)
    )


_NODE_COLUMNS = ("job_id", "level", "idx", *COLUMNS)
_UPSERT_NODE = _upsert_sql("metric_summaries", _NODE_COLUMNS[:3], COLUMNS)
_STATE_COLUMNS = ("job_id", "stream_ms", "stream_seq", "top")
_UPSERT_STATE = _upsert_sql("metric_summary_state", _STATE_COLUMNS[:1], _STATE_COLUMNS[1:])


def _executemany(s: Session, sql: str, width: int, rows: list[tuple[Any, ...]]) -> None:
    """One prepared statement, executemany on the driver's own connection (inside the
    session's transaction): SQLAlchemy's per-row parameter processing, and building an
    upsert construct per call, were most of the cost of keeping summaries."""
    if not rows:
        return
    conn: Any = s.connection().connection.driver_connection
    if s.get_bind().dialect.name == "sqlite":
        conn.executemany(sql.format(marks=", ".join("?" * width)), rows)
        return
    with conn.cursor() as cur:
        cur.executemany(sql.format(marks=", ".join(["%s"] * width)), rows)
