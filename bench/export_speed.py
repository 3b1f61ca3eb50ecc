"""Whole-run export speed: a run of ``--steps`` steps (default 1,000,000) of every per-step
field exported as Parquet (``export_stream``, what ``GET /jobs/{id}/metrics/export``
streams), in values per second, ``--repeats`` times; and its two halves apart: reading the
series (``scan_run``) and encoding blocks already read into Parquet.

Goal: >= 5,000,000 values/s of CPU time (the export's process and, on PostgreSQL, every
PostgreSQL process: on a shared machine wall time measures the neighbours); the wall-clock
rate is printed beside it. The synthetic run is written straight
into the chunks (tests/support/bulk_chunks.py, the store ``scan_run`` reads; the rows it
was loaded into before are no longer exported).

The MLflow peer (when its venv exists: :func:`bench.common.mlflow_peer`) records a smaller
run (``--peer-steps``) and reads each metric's full history (``get_metric_history``, MLflow's
only way to get a whole run out), as values per second beside amptrain's.

    python bench/export_speed.py [--steps 1000000] [--repeats 3] [--pg URL]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amptrain.contract.metrics import PARALLEL_METRIC_FIELDS
from amptrain.contract.spec import JobSpec
from amptrain.server.history_export import batches, encode, export_stream, schema
from amptrain.store import jobs, migrate
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.history.chunk_parts import MS, SEQ, STEP_SERIES
from amptrain.store.history.series_scan import SeriesBlock, scan_run
from bench.common import judge, mlflow_peer, postgres_cpu, throwaway_pg
from tests.support import bulk_chunks

GOAL = 5_000_000
"""Values per second of a whole-run Parquet export."""
FIELDS = tuple(f for f in STEP_SERIES if f not in PARALLEL_METRIC_FIELDS)
"""Every per-step series of a one-device fp16 run (the metric table's: 12 today)."""
T0 = 1_700_000_000_000


SERIES: dict[str, bulk_chunks.Series] = {
    "time": lambda st: 1e9 + st * 0.01,
    "loss": lambda st: 1 / (1 + st * 1e-4) + (st % 7) * 1e-3,
    "loss_scale": lambda st: numpy.full(len(st), 65536.0),
    "skipped": lambda st: (st % 4999 == 0).astype(numpy.float64),
    "grad_norm": lambda st: 1.0 + (st % 13) * 0.1,
    "lr": lambda st: numpy.full(len(st), 1e-3),
    "memory_allocated": lambda st: (2**30 + st % 1024).astype(numpy.float64),
    "memory_reserved": lambda st: numpy.full(len(st), 2.0**31),
    "memory_peak": lambda st: numpy.full(len(st), 2.0**31 + 7),
    "samples_per_second": lambda st: 5000.0 + st % 11,
    "step_time_ms": lambda st: 10.0 + st % 3,
    "skipped_steps": lambda st: (st // 4999).astype(numpy.float64),
    MS: lambda st: (T0 + st).astype(numpy.float64),  # each point's cursor (not exported)
    SEQ: lambda st: numpy.zeros(len(st)),
}
"""Every field of :data:`FIELDS` and the reserved cursor series a recorded point also
writes."""
assert set(SERIES) == {*FIELDS, MS, SEQ}, "a step field of the metric table needs its shape here"


def load_run(engine: sa.Engine, sessions: sessionmaker[Session], n: int) -> str:
    """A run of ``n`` steps written straight into the chunks and roll-ups (the store the
    export reads; tests/support/bulk_chunks.py)."""
    spec = JobSpec.model_validate(
        {"model": {"name": "mlp"}, "dataset": {"name": "synthetic-classification"}, "max_steps": n}
    )
    with sessions.begin() as s:
        job_id = jobs.create_job(s, spec, "bench", "cpu").id
    with sessions.begin() as s:
        bulk_chunks.load(s, job_id, n, SERIES)
    return job_id


def clock(pg: bool) -> tuple[float, float, float]:
    """Wall s, this process's CPU s, PostgreSQL's CPU s (0 on SQLite: it runs in here)."""
    return time.perf_counter(), time.process_time(), postgres_cpu() if pg else 0.0


def since(start: tuple[float, float, float], pg: bool) -> tuple[float, float, float]:
    now = clock(pg)
    return now[0] - start[0], now[1] - start[1], now[2] - start[2]


def bench(url: str, steps: int, repeats: int) -> dict[str, Any]:
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    pg = engine.dialect.name == "postgresql"
    started = time.perf_counter()
    job_id = load_run(engine, sessions, steps)
    print(
        f"\n{engine.dialect.name}: {steps:,} steps loaded in {time.perf_counter() - started:.1f} s"
    )
    values = steps * len(FIELDS)
    whole: list[float] = []  # values per CPU second
    for _ in range(repeats):
        start = clock(pg)
        size = sum(len(p) for p in export_stream(sessions, [job_id], "parquet", False))
        wall, cpu, db = since(start, pg)
        whole.append(values / (cpu + db))
        print(
            f"  export: {cpu:.2f} s CPU here + {db:.2f} s PostgreSQL = "
            f"{values / (cpu + db) / 1e6:.2f} M values/CPU s; {wall:.2f} s wall = "
            f"{values / wall / 1e6:.2f} M values/s; {size / 2**20:.1f} MiB ({size / values:.2f} B/value)"
        )
    # The halves (CPU): the store's read, and the encoding of blocks already in memory.
    with sessions() as s:
        start = clock(pg)
        blocks: list[tuple[str, SeriesBlock]] = [(job_id, b) for b in scan_run(s, job_id)]
        _, cpu, db = since(start, pg)
    read_rate = values / (cpu + db)
    start = clock(pg)
    for _ in encode(batches(iter(blocks), False), "parquet", schema(False)):
        pass
    _, cpu, _ = since(start, pg)
    encode_rate = values / cpu
    print(
        f"  halves (per CPU s): scan_run {read_rate / 1e6:.2f} M values/s | Parquet encoding "
        f"{encode_rate / 1e6:.2f} M values/s"
    )
    verdict = judge(f"{engine.dialect.name} export", whole, GOAL, lower_is_better=False)
    print("  " + verdict.line(" values/CPU s", 0))
    engine.dispose()
    return {"rates": whole, "scan_rate": read_rate, "encode_rate": encode_rate, "verdict": verdict}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pg", default=os.environ.get("AMPTRAIN_TEST_DATABASE_URL"))
    parser.add_argument("--peer-steps", type=int, default=20_000, help="0: no MLflow peer")
    args = parser.parse_args()
    print(
        f"export_speed: {args.steps:,} steps x {len(FIELDS)} fields = "
        f"{args.steps * len(FIELDS):,} values, Parquet, {args.repeats} repeats; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="amp-export-") as root:
        url = f"sqlite:///{root}/bench.db"
        migrate.upgrade(url)
        results["sqlite"] = bench(url, args.steps, args.repeats)
    if args.pg:
        url, drop = throwaway_pg(args.pg)
        try:
            migrate.upgrade(url)
            results["postgresql"] = bench(url, args.steps, args.repeats)
        finally:
            drop()
    peer = mlflow_peer(args.peer_steps, len(FIELDS)) if args.peer_steps else None
    if peer is not None:
        full = peer["full_history"]
        rate = full["points"] / full["cpu_s"]
        print(
            f"\nMLflow {peer['mlflow']} (SQLite store, {args.peer_steps:,} steps): one metric's "
            f"full history {full['points']:,} values in {full['cpu_s']:.2f} s CPU "
            f"({full['wall_s']:.2f} s wall) = {rate / 1e6:.3f} M values/CPU s"
        )
        for name, r in results.items():
            print(f"  amptrain {name} export / MLflow: {r['verdict'].median / rate:.1f}x")


if __name__ == "__main__":
    main()
