"""Which chunks a read needs, from the keys of ``metric_chunks`` alone (no chunk decoded, no
numpy: the Celery processes read :func:`recorded_through`): ranges of its primary key
(job, kind, name, chunk, attempt) and of its record-order index, so no plan depends on
planner statistics and a read's cost follows what it returns, not the run's length.

The record-order index (``ix_metric_chunks_record_order``, migration 0015) holds, per
kind and attempt, each :data:`~amptrain.store.history.chunk_parts.MS` chunk by its newest
cursor millisecond (``high``), then its number. An attempt records its steps in stream order, so its chunks
in step order are in cursor order: the chunks after a cursor are a range of the index.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.store.history.chunk_parts import MS, STEP_KIND


def names(s: Session, job_id: str, kind: str) -> list[str]:
    """Every series name of the job's ``kind`` (reserved ones included), in name order: one
    statement that skips from name to name through the primary key (a seek per name, not a
    scan of the kind's chunks)."""
    return [n for (n,) in s.execute(_NAMES, {"job": job_id, "kind": kind}) if n is not None]


_NAMES = sa.text(
    # Each step an ORDER BY ... LIMIT 1 (one index seek): a min() there was an aggregate
    # over the whole range on PostgreSQL without statistics.
    "WITH RECURSIVE n(name) AS ("
    " SELECT (SELECT name FROM metric_chunks WHERE job_id = :job AND kind = :kind"
    " ORDER BY name LIMIT 1)"
    " UNION ALL SELECT (SELECT c.name FROM metric_chunks c WHERE c.job_id = :job"
    " AND c.kind = :kind AND c.name > n.name ORDER BY c.name LIMIT 1) FROM n"
    " WHERE n.name IS NOT NULL"
    ") SELECT name FROM n"
)


def attempts(s: Session, job_id: str, kind: str) -> list[int]:
    """The attempts that recorded a ``kind`` record, ascending: a seek per attempt in the
    record-order index."""
    rows = s.execute(_ATTEMPTS, {"job": job_id, "kind": kind})
    return [int(a) for (a,) in rows if a is not None]


_MS_ONLY = f"name = '{MS}'"  # a literal: what lets both databases use the partial index
_ATTEMPTS = sa.text(
    "WITH RECURSIVE a(attempt) AS ("
    " SELECT (SELECT attempt FROM metric_chunks WHERE job_id = :job AND kind = :kind AND "
    f"{_MS_ONLY} ORDER BY attempt LIMIT 1)"
    " UNION ALL SELECT (SELECT c.attempt FROM metric_chunks c WHERE c.job_id = :job"
    f" AND c.kind = :kind AND c.{_MS_ONLY} AND c.attempt > a.attempt ORDER BY c.attempt"
    " LIMIT 1) FROM a WHERE a.attempt IS NOT NULL"
    ") SELECT attempt FROM a"
)


def chunks_after(
    s: Session,
    job_id: str,
    kind: str,
    attempt: int,
    after: tuple[int, int],
    upto_ms: int | None,
    n: int,
) -> list[int]:
    """The next ``n`` chunk numbers of ``attempt``'s ``kind`` records, in cursor order, whose
    newest cursor millisecond is at least ``after[0]`` and (``after[1]``) whose number is
    above ``after[1]``; with ``upto_ms``, only those that begin by then."""
    sql = _AFTER if upto_ms is None else _AFTER_UPTO
    params = {"job": job_id, "kind": kind, "attempt": attempt, "ms": after[0], "chunk": after[1]}
    return [int(c) for (c,) in s.execute(sql, {**params, "upto": upto_ms, "n": n})]


_AFTER_SQL = (
    "SELECT chunk FROM metric_chunks WHERE job_id = :job AND kind = :kind AND "
    f"{_MS_ONLY} AND attempt = :attempt AND high >= :ms AND chunk > :chunk {{upto}}"
    "ORDER BY high, chunk LIMIT :n"
)
_AFTER = sa.text(_AFTER_SQL.format(upto=""))
_AFTER_UPTO = sa.text(_AFTER_SQL.format(upto="AND low <= :upto "))


def chunks_between(s: Session, job_id: str, kind: str, first: int, last: int) -> list[int]:
    """The numbers of the chunks ``first..last`` holding ``kind`` records (of any attempt),
    ascending: a range of the primary key."""
    params = {"job": job_id, "kind": kind, "first": first, "last": last}
    return sorted({int(c) for (c,) in s.execute(_BETWEEN, params)})


_BETWEEN = sa.text(
    f"SELECT chunk FROM metric_chunks WHERE job_id = :job AND kind = :kind AND {_MS_ONLY} "
    "AND chunk BETWEEN :first AND :last ORDER BY chunk"
)


def newest_chunks(s: Session, job_id: str, kind: str, attempt: int) -> list[int]:
    """The chunk numbers of ``attempt``'s ``kind`` records that hold its newest cursor
    millisecond (usually one; two when a chunk boundary fell within a millisecond)."""
    rows = s.execute(_NEWEST, {"job": job_id, "kind": kind, "attempt": attempt})
    return [int(c) for (c,) in rows]


_NEWEST = sa.text(
    "SELECT chunk FROM metric_chunks WHERE job_id = :job AND kind = :kind AND "
    f"{_MS_ONLY} AND attempt = :attempt AND high >= (SELECT high FROM metric_chunks "
    f"WHERE job_id = :job AND kind = :kind AND {_MS_ONLY} AND attempt = :attempt "
    "ORDER BY high DESC LIMIT 1)"
)


def recorded_through(s: Session, job_id: str) -> dict[int, int]:
    """Per attempt, the newest step of its points: the last step of the chunk holding its
    newest cursor (an attempt records its steps in stream order)."""
    out = {}
    for attempt in attempts(s, job_id, STEP_KIND):
        row = s.execute(_THROUGH, {"job": job_id, "kind": STEP_KIND, "attempt": attempt}).first()
        if row is not None:
            out[attempt] = int(row[0])
    return out


_THROUGH = sa.text(
    "SELECT last_step FROM metric_chunks WHERE job_id = :job AND kind = :kind AND "
    f"{_MS_ONLY} AND attempt = :attempt ORDER BY high DESC, chunk DESC LIMIT 1"
)
