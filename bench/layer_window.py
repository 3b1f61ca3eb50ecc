"""The downsampled layer-norm read (``GET /jobs/{id}/layer-norms?max_points=1000``: 129
layers, so the route's byte bound keeps 775 steps) of runs with norms every 10 steps, from
the chunks' roll-ups (``eval_window``) and, with ``--before``, through the previous
version's read of the per-value rows (tests/support/row_eval_window.py), which must give the
same answer. On a database whose planner has never seen statistics; the chunks and roll-ups
written by the recorder's own write (``rollups.record``), the rows bulk-copied.

    python bench/layer_window.py --steps 100000,1000000 [--before] [--pg URL]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.layers import LAYER_NORMS_READ_VALUES
from amptrain.contract.metrics import LAYER_NORM_KIND
from amptrain.store import migrate
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.history import rollups
from amptrain.store.history.eval_window import eval_window
from bench.common import throwaway_pg
from bench.history_query import new_job
from tests.support import row_tables
from tests.support.row_eval_window import row_eval_window

LAYERS = 129
EVERY = 10
RECORDS_PER_BATCH = 1_000
_COLUMNS = ("job_id", "attempt", "step", "kind", "name", "value", "time", "stream_ms", "stream_seq")


def _values(job_id: str, steps: range) -> list[dict[str, Any]]:
    out = []
    for step in steps:
        ms = 1_700_000_000_000 + step * 7
        for i in range(LAYERS):
            value = 1e3 if step % 99_991 == 0 and i == 5 else (step % 97 + i) / 50
            out.append(
                dict(
                    zip(
                        _COLUMNS,
                        (job_id, 1, step, LAYER_NORM_KIND, f"layers.{i}", value, ms / 1000, ms, 0),
                        strict=True,
                    )
                )
            )
    return out


def seed(sessions: sessionmaker[Session], job_id: str, n: int, rows: bool) -> float:
    """Norms every ``EVERY`` steps up to ``n``; the seconds it took."""
    started = time.perf_counter()
    span = EVERY * RECORDS_PER_BATCH
    for start in range(EVERY, n + 1, span):
        values = _values(job_id, range(start, min(n, start + span - 1) + 1, EVERY))
        with sessions.begin() as s:
            rollups.record(s, [], values)
            if rows:  # the oracle's own rows (the product has none since 0017)
                row_tables.ensure(s.connection())
                _copy_rows(s, values)
    return time.perf_counter() - started


def _copy_rows(s: Session, values: list[dict[str, Any]]) -> None:
    conn: Any = s.connection().connection.driver_connection
    tuples = [tuple(v[c] for c in _COLUMNS) for v in values]
    if s.get_bind().dialect.name == "sqlite":
        marks = ", ".join("?" * len(_COLUMNS))
        conn.executemany(
            f"INSERT INTO metric_values ({', '.join(_COLUMNS)}) VALUES ({marks})", tuples
        )
        return
    with (
        conn.cursor() as cur,
        cur.copy(f"COPY metric_values ({', '.join(_COLUMNS)}) FROM STDIN") as copy,
    ):
        for t in tuples:
            copy.write_row(t)


def timed(fn: Any, reads: int) -> tuple[list[float], Any]:
    result = fn()
    out = []
    for _ in range(reads):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out, result


def run(url: str, n: int, before: bool, reads: int) -> None:
    migrate.upgrade(url, "head")
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    job_id = new_job(sessions, n)
    took = seed(sessions, job_id, n, before)
    kept = min(1000, LAYERS and LAYER_NORMS_READ_VALUES // LAYERS)
    name = engine.dialect.name
    print(
        f"{name} {n:,} steps, {n // EVERY * LAYERS:,} norms (seeded in {took:.0f} s), max_points {kept}:"
    )
    readers = {"after (chunks)": eval_window}
    if before:
        readers["before (rows)"] = row_eval_window
    answers = {}
    for label, reader in readers.items():
        with sessions() as s:
            ms, window = timed(lambda: reader(s, job_id, kept, kind=LAYER_NORM_KIND), reads)  # noqa: B023
        body = json.dumps({"items": window.items, "next_cursor": window.next_cursor}).encode()
        answers[label] = body
        print(
            f"  {label:15} median {statistics.median(ms):9.1f} ms (min {min(ms):.1f}, max "
            f"{max(ms):.1f}, {len(ms)} reads), {len(window.items)} items, {len(body):,} bytes"
        )
    if before:
        print("  same answer:", answers["after (chunks)"] == answers["before (rows)"])
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", default="100000")
    parser.add_argument("--before", action="store_true")
    parser.add_argument("--pg", help="an admin URL of a PostgreSQL server: a throwaway database")
    parser.add_argument("--reads", type=int, default=5)
    args = parser.parse_args()
    for n in (int(x) for x in args.steps.split(",")):
        if args.pg:
            url, drop = throwaway_pg(args.pg)
            try:
                run(url, n, args.before, args.reads)
            finally:
                drop()
        else:
            with tempfile.TemporaryDirectory() as d:
                run(f"sqlite:///{Path(d) / 'bench.db'}", n, args.before, args.reads)


if __name__ == "__main__":
    main()
