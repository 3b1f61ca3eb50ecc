"""What PostgreSQL's autovacuum does to a bench's tables, done by the bench itself.

A bench writes a run faster than the run happened (a 1M-step run's step fields in about a
minute instead of hours), and the test server may have autovacuum off, so a bench that
waited for the real daemon would measure either nothing or the server's luck. The bench
instead calls :meth:`Autovacuum.send_stats` and :meth:`Autovacuum.run` with the run's own
clock (seconds since its first step) in and after each transaction; at every
``autovacuum_naptime`` of that clock it does what the launcher's worker does for each table
(``relation_needs_vacanalyze`` in PostgreSQL's ``autovacuum.c``): a plain ``VACUUM`` (lazy: it frees dead row versions for reuse and
truncates empty pages at the end; never ``FULL``) of every table whose dead rows exceed
``autovacuum_vacuum_threshold + autovacuum_vacuum_scale_factor * reltuples``, or whose rows
inserted since its last vacuum exceed the insert threshold likewise; the table's own storage
parameters first, else the server's settings. Only the cost-based delay (it paces the same
work) and analyze are left out.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from bench.table_size import leaves


def _setting(name: str) -> str:
    """A table's storage parameter ``name``, else the server's setting, as float8."""
    return (
        f"coalesce((SELECT option_value FROM pg_options_to_table(c.reloptions) "
        f"WHERE option_name = '{name}'), current_setting('{name}'))::float8"
    )


_DUE = sa.text(
    "SELECT c.relname FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid "
    "WHERE c.relname IN :tables AND ("
    f"s.n_dead_tup > {_setting('autovacuum_vacuum_threshold')} "
    f"+ {_setting('autovacuum_vacuum_scale_factor')} * greatest(c.reltuples, 0) "
    f"OR ({_setting('autovacuum_vacuum_insert_threshold')} >= 0 AND s.n_ins_since_vacuum > "
    f"{_setting('autovacuum_vacuum_insert_threshold')} "
    f"+ {_setting('autovacuum_vacuum_insert_scale_factor')} * greatest(c.reltuples, 0)))"
).bindparams(sa.bindparam("tables", expanding=True))


_NAPTIME = sa.text("SELECT extract(epoch FROM current_setting('autovacuum_naptime')::interval)")


class Autovacuum:
    """``Autovacuum(engine, tables)``: :meth:`send_stats` in each of the bench's
    transactions, :meth:`run` after it.
    On SQLite (no autovacuum: it reuses freed pages itself) neither does anything."""

    def __init__(self, engine: Any, tables: list[str]) -> None:
        self.engine = engine
        self.on = engine.dialect.name == "postgresql"
        self.tables = tables
        """What autovacuum visits: a partitioned table's partitions (it never takes the
        parent, which holds no rows), each by its own parameters and statistics."""
        self.naptime = 60.0
        if self.on:
            with engine.connect() as conn:
                self.naptime = float(conn.execute(_NAPTIME).scalar_one())
                self.tables = leaves(conn, tables)
        self.next = self.naptime
        self.vacuums = 0
        """Tables vacuumed so far (a table once per naptime at most)."""

    def send_stats(self, s: Any, run_clock: float) -> None:
        """In the bench's open transaction ``s`` (which then commits): when ``run_clock``
        passed the next naptime, have this backend's statistics sent at its commit (a
        server's backends send theirs within a second; the bench's clock runs faster), so the
        next check sees every dead row."""
        if self.on and run_clock >= self.next:
            s.execute(sa.text("SELECT pg_stat_force_next_flush()"))

    def run(self, run_clock: float) -> None:
        """After the transaction that :meth:`send_stats` saw: vacuum the tables that are due."""
        if not self.on or run_clock < self.next:
            return
        self.next = (run_clock // self.naptime + 1) * self.naptime
        with self.engine.connect() as conn:
            due = list(conn.execute(_DUE, {"tables": self.tables}).scalars())
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in due:
                conn.execute(sa.text(f"VACUUM {table}"))
        self.vacuums += len(due)
