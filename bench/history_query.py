"""A downsampled history read (``series_window(max_points=1000)``) over runs of 10k, 100k
and 1M steps: from the points (``raw_window``, GROUP BY over the steps) and from the
metric summaries, whole run and a mid-run window, side by side; plus what keeping the
summaries costs the recorder (``summary_writes.add_points`` per 1,000 points).

Goal: a read over a 1,000,000-step run in <= 100 ms on SQLite and on PostgreSQL, and a
cost that does not grow with the run's length; the recorder still >= 20,000 points/s on
SQLite and >= 50,000/s on PostgreSQL with summaries.

    python bench/history_query.py                 # SQLite; PostgreSQL too with
    AMPTRAIN_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        python bench/history_query.py --quick     # or --pg URL
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amptrain.contract.metrics import STORED_METRIC_FIELDS
from amptrain.contract.spec import JobSpec
from amptrain.store import jobs, migrate, recording
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.history import rebuild as summary_rebuild
from amptrain.store.history import summary_writes
from amptrain.store.history.downsample import series_window
from amptrain.store.history.raw_window import raw_window
from bench.common import throwaway_pg
from tests.support.bulk_points import bulk_insert_points

COLUMNS = (
    "job_id",
    "attempt",
    "stream_ms",
    "stream_seq",
    "step",
    "time",
    "loss",
    "grad_norm",
    "skipped",
    "loss_scale",
)
T0 = 1_700_000_000_000


def rows(job_id: str, n: int) -> Iterator[tuple[Any, ...]]:
    """A noisy falling loss, a spike every 99,991 steps, a skipped step every 4,999."""
    for step in range(1, n + 1):
        loss = 1 / math.sqrt(step) + 0.05 * math.sin(step * 1.7)
        if step % 99_991 == 0:
            loss = 40.0
        skipped = step % 4_999 == 0
        yield (job_id, 1, T0 + step, 0, step, 1e9 + step, loss, 1.0, skipped, 65536.0)


def new_job(sessions: sessionmaker[Session], steps: int) -> str:
    spec = JobSpec.model_validate(
        {
            "model": {"name": "mlp"},
            "dataset": {"name": "synthetic-classification"},
            "max_steps": steps,
        }
    )
    with sessions.begin() as s:
        return jobs.create_job(s, spec, "bench", "cpu").id


def seed(engine: sa.Engine, job_id: str, n: int) -> None:
    """``n`` points straight through the driver: a million rows in seconds."""
    bulk_insert_points(engine, COLUMNS, rows(job_id, n))


def timed(fn: Callable[[], Any], reads: int) -> tuple[float, float]:
    """Median and p95 wall time in ms."""
    fn()  # warm the caches and the statement cache
    samples = []
    for _ in range(reads):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(0.95 * len(samples)))]


def read(sessions: sessionmaker[Session], how: Callable[..., Any], job_id: str, **kw: Any) -> Any:
    with sessions() as s:
        return how(s, job_id, 1000, **kw)


def bench_reads(
    engine: sa.Engine, sessions: sessionmaker[Session], lengths: list[int], reads: int
) -> None:
    name = engine.dialect.name
    print(f"\n{name}: series_window(max_points=1000), ms median / p95")
    print(f"{'steps':>9} {'window':>8} {'raw':>17} {'summaries':>17} {'ratio':>7} {'same':>5}")
    for n in lengths:
        job_id = new_job(sessions, n)
        seed(engine, job_id, n)
        started = time.perf_counter()
        with sessions.begin() as s:
            summary_rebuild.rebuild(s, job_id)
        print(f"{n:>9,} summaries rebuilt in {time.perf_counter() - started:.1f} s")
        for label, kw in (("whole", {}), ("mid", {"from_step": n // 3, "to_step": n // 2})):
            raw_reads = max(2, reads // 5) if n >= 1_000_000 else reads
            raw = timed(partial(read, sessions, raw_window, job_id, **kw), raw_reads)
            fast = timed(partial(read, sessions, series_window, job_id, **kw), reads)
            same = read(sessions, raw_window, job_id, **kw).items == (
                read(sessions, series_window, job_id, **kw).items
            )
            print(
                f"{n:>9,} {label:>8} {raw[0]:>8.1f} /{raw[1]:>7.1f} {fast[0]:>8.1f} /{fast[1]:>7.1f}"
                f" {raw[0] / fast[0]:>6.0f}x {same!s:>5}"
            )


def bench_writes(sessions: sessionmaker[Session], points: int, batch: int) -> None:
    """The recorder's transaction with and without add_points, batches of ``batch``."""
    job_id = new_job(sessions, points)
    insert_s = summary_s = summary_cpu = 0.0
    blank = dict.fromkeys(STORED_METRIC_FIELDS)
    every = [blank | dict(zip(COLUMNS, r, strict=True)) for r in rows(job_id, points)]
    for start in range(0, points, batch):
        chunk = every[start : start + batch]
        with sessions.begin() as s:
            t0 = time.perf_counter()
            inserted = recording.insert_points(s, chunk).get(job_id, set())
            s.flush()
            t1, c1 = time.perf_counter(), time.process_time()
            summary_writes.add_points(
                s, {job_id: [p for p in chunk if (p["attempt"], p["step"]) in inserted]}
            )
            t2 = time.perf_counter()
            summary_cpu += time.process_time() - c1
        insert_s += t1 - t0
        summary_s += t2 - t1
    per_k = summary_s / points * 1000 * 1000
    print(
        f"\nrecording {points:,} points in batches of {batch}: insert {points / insert_s:,.0f}/s,"
        f" add_points {per_k:.1f} ms per 1,000 points"
        f" ({summary_cpu / points * 1e6:.1f} ms of this process's CPU),"
        f" both {points / (insert_s + summary_s):,.0f}/s"
    )


def run(url: str, lengths: list[int], reads: int, write_points: int) -> None:
    migrate.upgrade(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    try:
        bench_writes(sessions, write_points, 1000)
        bench_reads(engine, sessions, lengths, reads)
    finally:
        engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10k and 100k steps, 5 reads")
    ap.add_argument("--pg", default=os.environ.get("AMPTRAIN_TEST_DATABASE_URL"))
    ap.add_argument("--reads", type=int, default=20)
    args = ap.parse_args()
    lengths = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    reads = 5 if args.quick else args.reads
    write_points = 20_000 if args.quick else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        run(f"sqlite:///{tmp}/bench.db", lengths, reads, write_points)
    if args.pg:
        url, drop = throwaway_pg(args.pg)
        try:
            run(url, lengths, reads, write_points)
        finally:
            drop()


if __name__ == "__main__":
    main()
