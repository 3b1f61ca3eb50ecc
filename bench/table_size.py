"""What tables hold on disk, indexes included: as they are, and compacted (rewritten dense).
SQLite: the ``dbstat`` pages of each table and index; PostgreSQL:
``pg_total_relation_size`` (heap, TOAST and indexes) of every leaf of each table's partition
tree (a partitioned table, ``metric_chunks`` since revision 0021, holds nothing itself: its
partitions do; a plain table is its own one leaf)."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa


def table_bytes(engine: Any, tables: list[str]) -> int:
    """The bytes of ``tables`` and their indexes (and TOAST) as they are now."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            return int(conn.execute(_PG_BYTES, {"t": leaves(conn, tables)}).scalar_one() or 0)
        names = conn.execute(
            sa.text("SELECT name FROM sqlite_master WHERE tbl_name IN :t").bindparams(
                sa.bindparam("t", expanding=True)
            ),
            {"t": tables},
        ).scalars()
        marks = list(names)
        total = conn.execute(
            sa.text("SELECT sum(pgsize) FROM dbstat WHERE name IN :n").bindparams(
                sa.bindparam("n", expanding=True)
            ),
            {"n": marks},
        ).scalar_one()
        return int(total or 0)


_PG_BYTES = sa.text(
    "SELECT sum(pg_total_relation_size(t::regclass)) FROM unnest(CAST(:t AS text[])) t"
)


def leaves(conn: Any, tables: list[str]) -> list[str]:
    """The relations of PostgreSQL ``tables`` that hold rows: each table's partitions (all
    levels), or the table itself where it is not partitioned."""
    return list(conn.execute(_LEAVES, {"t": tables}).scalars())


_LEAVES = sa.text(
    "SELECT coalesce(p.relid, c.oid)::regclass::text "
    "FROM unnest(CAST(:t AS text[])) t JOIN pg_class c ON c.oid = t::regclass "
    "LEFT JOIN pg_partition_tree(c.oid) p ON c.relkind = 'p' AND p.isleaf "
    "WHERE c.relkind <> 'p' OR p.relid IS NOT NULL"
)


def compact(engine: Any, tables: list[str]) -> int:
    """The tables' bytes once the row versions that open chunks' rewrites left behind are
    gone and the pages are rewritten dense (``VACUUM FULL`` / ``VACUUM``): the floor."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if engine.dialect.name == "postgresql":
            for t in tables:
                _vacuum_full(conn, t)
        else:
            conn.execute(sa.text("VACUUM"))
    return table_bytes(engine, tables)


def _vacuum_full(conn: Any, table: str) -> None:
    """``VACUUM FULL table``, again while it fails on a TOAST value a lazy vacuum removed: a
    PostgreSQL bug (#18351, #19519, unfixed in 15), where the rewrite keeps a row version
    another database's open transaction still counts as recently dead but the vacuum of the
    TOAST table (after the heap's, with a newer horizon) already dropped its value. The
    version is dead once that transaction ends; a shared test server has such transactions."""
    for _ in range(60):
        try:
            conn.execute(sa.text(f"VACUUM FULL {table}"))
            return
        except sa.exc.InternalError as exc:
            if "missing chunk number" not in str(exc.orig):
                raise
            time.sleep(1.0)
    raise RuntimeError(f"VACUUM FULL {table} kept failing on a removed TOAST value")
