"""The oracles' metric points (``metric_points`` of :mod:`tests.support.row_tables`: the
product has no row tables since migration 0017) written straight through the database
driver (COPY on PostgreSQL, a streamed executemany on SQLite): a million rows in seconds,
never all in memory. The table must exist (:func:`tests.support.row_tables.ensure`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa


def bulk_insert_points(
    engine: sa.Engine,
    columns: Sequence[str],
    rows: Iterable[tuple[Any, ...]],
    analyze: bool = True,
) -> None:
    """Insert ``rows`` (tuples in the order of ``columns``) into ``metric_points``;
    ``analyze``: then give PostgreSQL's planner statistics, as autovacuum would."""
    names = ", ".join(columns)
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        if engine.dialect.name == "postgresql":
            with cur.copy(f"COPY metric_points ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            sqlite = raw.driver_connection
            assert isinstance(sqlite, sqlite3.Connection)  # its executemany takes an iterator
            marks = ", ".join("?" for _ in columns)
            sqlite.executemany(f"INSERT INTO metric_points ({names}) VALUES ({marks})", rows)
        raw.commit()
        if analyze and engine.dialect.name == "postgresql":
            # What autovacuum does after a bulk load; without statistics the planner guesses.
            cur.execute("ANALYZE metric_points")
            raw.commit()
    finally:
        raw.close()
