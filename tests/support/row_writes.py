"""The recorder's old row writers, kept as the test oracles' own: the per-value rows
(``metric_points``, ``metric_values``: :mod:`tests.support.row_tables`) written as the
recorder wrote them up to revision 0016, so the row reads of tests/support (the reads
before the chunks) still have their rows to read. The product writes chunks only.

:func:`record_stream` writes a job's rows from its telemetry stream, as the old recorder
did from the same entries (the recorder's own parser; ``ON CONFLICT DO NOTHING``: a
re-sent entry adds nothing and the first value stays, as in the chunks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import STORED_METRIC_FIELDS
from amptrain.core.redis import Keys
from amptrain.server.recorder.entries import parse
from amptrain.store.db import dialect_insert
from tests.support import row_tables
from tests.support.row_tables import MetricValue

POINT_COLUMNS = ("job_id", "attempt", "stream_ms", "stream_seq", *STORED_METRIC_FIELDS)
"""``memory_peak_per_rank`` travels as JSON text, as the old writer sent it."""
_INSERT = (
    f"INSERT INTO metric_points ({', '.join(POINT_COLUMNS)}) VALUES ({{marks}}) "
    "ON CONFLICT (job_id, attempt, step) DO NOTHING"
)
VALUE_PAGE = 500
"""Value rows per statement (9 parameters each: far below SQLite's limit)."""


def insert_points(s: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Insert the points not there yet (dicts of :data:`POINT_COLUMNS`), in the order given,
    through the driver as the old writer did (one prepared statement)."""
    if not rows:
        return
    conn: Any = s.connection().connection.driver_connection
    mark = "?" if s.get_bind().dialect.name == "sqlite" else "%s"
    sql = _INSERT.format(marks=", ".join([mark] * len(POINT_COLUMNS)))
    params = [tuple(r.get(c) for c in POINT_COLUMNS) for r in rows]
    if s.get_bind().dialect.name == "sqlite":
        conn.executemany(sql, params)
    else:
        with conn.cursor() as cur:
            cur.executemany(sql, params)


def insert_values(s: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Insert the value rows (the columns of ``metric_values`` but ``id``) not there yet."""
    for i in range(0, len(rows), VALUE_PAGE):
        stmt = dialect_insert(s, MetricValue).values(list(rows[i : i + VALUE_PAGE]))
        key = ["job_id", "attempt", "step", "kind", "name"]
        s.execute(stmt.on_conflict_do_nothing(index_elements=key))


def record_stream(sf: sessionmaker[Session], r: redis.Redis, job_id: str) -> None:
    """The rows the old recorder wrote from the job's telemetry stream (every entry still
    in it), in stream order, in one transaction."""
    entries = [
        (eid, [x for kv in fields.items() for x in kv])
        for eid, fields in r.xrange(Keys.telemetry(job_id))  # type: ignore[union-attr]
    ]
    batch = parse(job_id, entries)
    with sf.begin() as s:
        row_tables.ensure(s.connection())
        insert_points(s, batch.points)
        insert_values(s, batch.values)
    with sf() as s:
        analyse(s)
        s.commit()


def analyse(s: Session) -> None:
    """Planner statistics for the oracle's tables (not the store's: its reads are tested
    without them). The oracle's reads join these rows to themselves; without statistics on
    tables just filled, PostgreSQL chose nested loops (the window parity test's oracle took
    45 s of its 60, 18 s with them) and SQLite scans (a retried run's oracle reads: 15.5 s,
    1 s with them)."""
    for table in row_tables.RowBase.metadata.sorted_tables:
        s.execute(sa.text(f"ANALYZE {table.name}"))
