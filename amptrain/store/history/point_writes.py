"""Bulk inserts of metric points on the driver's own connection, inside the caller's
(SQLAlchemy session's) transaction: the recorder's hot path.

Every path inserts with ON CONFLICT (job_id, attempt, step) DO NOTHING and returns
the (job_id, attempt, step) of the rows it actually added, so a replayed entry adds
nothing. Rows go in the order given (the recorder passes each job's points in
stream order), so row ids follow the stream.

* PostgreSQL ``copy`` (default): COPY straight into ``metric_points`` inside a
  savepoint of the session's transaction; if a row is already there (a replay: rare),
  the savepoint is rolled back and the rows go through a session-local temp table and
  one ``INSERT ... SELECT ... ON CONFLICT DO NOTHING RETURNING`` instead.
* PostgreSQL ``values``: one prepared single-row INSERT sent for every row in
  psycopg's pipeline mode (``executemany(returning=True)``).
* SQLite: multi-row ``INSERT ... VALUES`` pages with RETURNING through one cached
  statement per page size.

Why not SQLAlchemy's own executemany ("insertmanyvalues"): it renders one long SQL
text per page, which psycopg re-parses for every page (its query cache skips texts
over 4 KiB) -- that parsing was a third of the recorder's time on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from operator import itemgetter
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from amptrain.contract.metrics import STORED_METRIC_FIELDS

PG_METHODS = ("copy", "values")
PG_DEFAULT = "copy"
"""The faster PostgreSQL path as measured by bench/recorder_throughput.py."""

COLUMNS = ("job_id", "attempt", "stream_ms", "stream_seq", *STORED_METRIC_FIELDS)
"""``memory_peak_per_rank`` travels as JSON text (a list would be adapted as an array)."""
_row = itemgetter(*COLUMNS)
_COLS = ", ".join(COLUMNS)
_CONFLICT = "ON CONFLICT (job_id, attempt, step) DO NOTHING RETURNING job_id, attempt, step"

_TEMP = "recorder_points"
# Created once per database connection, emptied at every commit: no catalog churn per batch.
_CREATE_TEMP = (
    f"CREATE TEMP TABLE IF NOT EXISTS {_TEMP} ON COMMIT DELETE ROWS "
    f"AS SELECT {_COLS} FROM metric_points WITH NO DATA"
)
_FROM_TEMP = (
    f"INSERT INTO metric_points ({_COLS}) SELECT {_COLS} FROM {_TEMP} "
    f"ORDER BY job_id, stream_ms, stream_seq {_CONFLICT}"
)
_ONE_ROW = (
    f"INSERT INTO metric_points ({_COLS}) VALUES ({', '.join(['%s'] * len(COLUMNS))}) {_CONFLICT}"
)

SQLITE_PAGE = 500
"""Rows per SQLite statement (19 parameters each: well under SQLite's 32766 limit)."""

Inserted = set[tuple[str, int, int]]


def insert(s: Session, rows: list[dict[str, Any]], method: str | None = None) -> Inserted:
    """Insert ``rows`` (dicts keyed by :data:`COLUMNS`); the keys of the new ones."""
    if not rows:
        return set()
    dialect = s.get_bind().dialect.name
    conn = _driver(s)
    if dialect == "postgresql":
        method = method or PG_DEFAULT
        if method == "copy":
            return _pg_copy(s, rows)
        if method == "values":
            return _pg_values(conn, rows)
        raise ValueError(f"unknown PostgreSQL insert method {method!r} (one of {PG_METHODS})")
    if dialect == "sqlite":
        return _sqlite_pages(conn, rows)
    raise RuntimeError(f"unsupported database: {dialect}")


def _driver(s: Session) -> Any:
    """The session's psycopg / sqlite3 connection, in the session's transaction."""
    return s.connection().connection.driver_connection


def _pg_copy(s: Session, rows: list[dict[str, Any]]) -> Inserted:
    try:
        # SQLAlchemy's savepoint, not psycopg's conn.transaction(): when the COPY is the
        # transaction's first statement, psycopg's would be a transaction of its own and
        # commit the points at once, before the batch's events and progress (watchers saw
        # points without the event recorded before them) and beyond the batch's rollback.
        with (
            s.begin_nested(),
            # Asked for inside the savepoint: its first use is what emits the SAVEPOINT.
            _driver(s).cursor() as cur,
            cur.copy(f"COPY metric_points ({_COLS}) FROM STDIN") as copy,
        ):
            for r in rows:
                copy.write_row(_row(r))
        return {(r["job_id"], r["attempt"], r["step"]) for r in rows}
    except psycopg.errors.UniqueViolation:
        return _pg_copy_new_only(_driver(s), rows)


def _pg_copy_new_only(conn: Any, rows: list[dict[str, Any]]) -> Inserted:
    with conn.cursor() as cur:
        cur.execute(_CREATE_TEMP)
        with cur.copy(f"COPY {_TEMP} ({_COLS}) FROM STDIN") as copy:
            for r in rows:
                copy.write_row(_row(r))
        cur.execute(_FROM_TEMP)
        inserted: Inserted = {tuple(k) for k in cur.fetchall()}
        # Emptied at commit anyway; a second batch in the same transaction must not see these.
        cur.execute(f"TRUNCATE {_TEMP}")
    return inserted


def _pg_values(conn: Any, rows: list[dict[str, Any]]) -> Inserted:
    inserted: Inserted = set()
    with conn.cursor() as cur:
        cur.executemany(_ONE_ROW, [_row(r) for r in rows], returning=True)
        while True:
            inserted.update(tuple(k) for k in cur.fetchall())
            if not cur.nextset():
                return inserted


def _sqlite_pages(conn: Any, rows: list[dict[str, Any]]) -> Inserted:
    inserted: Inserted = set()
    for page in _pages(rows, SQLITE_PAGE):
        sql = _sqlite_insert(len(page))
        cur = conn.execute(sql, list(chain.from_iterable(map(_row, page))))
        inserted.update(cur.fetchall())
        cur.close()
    return inserted


def _sqlite_insert(n: int) -> str:
    # The sqlite3 module caches prepared statements by text: full pages share one.
    one = f"({', '.join(['?'] * len(COLUMNS))})"
    return f"INSERT INTO metric_points ({_COLS}) VALUES {', '.join([one] * n)} {_CONFLICT}"


def _pages(rows: list[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    for i in range(0, len(rows), size):
        yield rows[i : i + size]
