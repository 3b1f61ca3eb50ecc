"""Storage per recorded value: what a history costs in SQL, the chunks (``metric_chunks``),
their roll-ups (``metric_rollups``) and exemplars (``metric_exemplars``), indexes included,
on SQLite (the ``dbstat`` table's pages of each table and index) and PostgreSQL (``pg_total_relation_size``: heap,
TOAST and indexes). (The per-value rows the chunks replaced, 30-45 bytes a value, are gone
since migration 0017.)

Two runs of one job per database, both written by the recorder's own write
(:func:`amptrain.store.history.rollups.record`: chunks and roll-ups, in batches of
``--batch`` steps, as the recorder's transactions do) from synthetic values shaped like a training run's
(float32 losses and norms, a float64 learning-rate schedule, a wall clock, near-constant
memory counters):

* the step fields of ``--steps`` steps (default 1,000,000): every value the run records
  (a one-device run records no ``world_size``: its all-null chunks count as overhead);
* 256 layer norms at every step of ``--layer-steps`` steps.

"As held" is what the database holds at the end of the run: on PostgreSQL with autovacuum
doing what a server's does during the run, by the run's own clock (40 steps a second; see
:mod:`bench.autovacuum`: the bench runs the same lazy ``VACUUM`` at each naptime for the
tables past their thresholds, the tables' storage parameters included); SQLite reuses
freed pages itself. "Compacted" is after ``VACUUM FULL`` / ``VACUUM``: the floor.

Goal: at most 8 bytes per value as held, roll-ups and exemplars included.

    python bench/storage_size.py [--steps 1000000] [--layer-steps 4000] [--pg URL]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.autovacuum import Autovacuum
from bench.common import SPEC, judge, throwaway_pg

GOAL = 8.0
LAYERS = 256
STEP_S = 0.025
"""The synthetic run's clock: a step every 25 ms (its ``time`` values, and autovacuum's)."""
TABLES = ["metric_chunks", "metric_rollups", "metric_exemplars"]
BESIDE = TABLES[1:]
"""What the reads need beside the chunks: the roll-ups and their blocks' exemplars."""


def step_points(job_id: str, first: int, n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    steps = np.arange(first, first + n)
    loss = (2.0 * np.exp(-steps / 3e5) + rng.normal(0, 0.05, n)).astype(np.float32)
    grad = np.abs(rng.normal(1.0, 0.3, n)).astype(np.float32)
    lr = 1e-3 * 0.5 * (1 + np.cos(np.pi * steps / 2e6))
    rate = 1000.0 + rng.normal(0, 15, n)
    ms = 25.0 + rng.normal(0, 0.5, n)
    skipped = rng.random(n) < 0.001
    out = []
    for i, step in enumerate(steps.tolist()):
        out.append(
            {
                "job_id": job_id,
                "attempt": 1,
                "step": step,
                "time": 1.7e9 + step * STEP_S,
                "loss": float(loss[i]),
                "loss_scale": 65536.0,
                "skipped": bool(skipped[i]),
                "grad_norm": float(grad[i]),
                "lr": float(lr[i]),
                "memory_allocated": 1_234_567_168,
                "memory_reserved": 2_147_483_648,
                "memory_peak": 1_734_567_168,
                "samples_per_second": float(rate[i]),
                "step_time_ms": float(ms[i]),
                "skipped_steps": int(step // 1000),
                "world_size": None,
                "memory_peak_per_rank": None,
                # The stream cursor, as the recorder's points carry it (its chunks keep it).
                "stream_ms": 1_700_000_000_000 + step * 25,
                "stream_seq": 0,
            }
        )
    return out


def layer_values(job_id: str, first: int, n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    norms = np.abs(rng.normal(0.1, 0.03, (n, LAYERS))).astype(np.float32)
    return [
        {
            "job_id": job_id,
            "attempt": 1,
            "step": first + i,
            "kind": "layer_grad_norm",
            "name": f"blocks.{k // 2}.{'weight' if k % 2 == 0 else 'bias'}",
            "value": float(norms[i, k]),
            "time": 1.7e9 + (first + i) * STEP_S,
            "stream_ms": 1_700_000_000_000 + first + i,
            "stream_seq": 0,
        }
        for i in range(n)
        for k in range(LAYERS)
    ]


def table_bytes(engine: Any, tables: list[str]) -> int:
    import sqlalchemy as sa

    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            return sum(
                int(conn.execute(sa.text(f"SELECT pg_total_relation_size('{t}')")).scalar_one())
                for t in tables
            )
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


def compact(engine: Any, tables: list[str]) -> int:
    """The tables' bytes once the row versions that open chunks' rewrites left behind are
    gone and the pages are rewritten dense (``VACUUM FULL`` / ``VACUUM``): the floor."""
    import sqlalchemy as sa

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if engine.dialect.name == "postgresql":
            for t in tables:
                conn.execute(sa.text(f"VACUUM FULL {t}"))
        else:
            conn.execute(sa.text("VACUUM"))
    return table_bytes(engine, tables)


def measure(url: str, args: argparse.Namespace) -> None:
    from amptrain.contract.spec import JobSpec
    from amptrain.store import jobs, migrate
    from amptrain.store.db import make_engine, make_session_factory
    from amptrain.store.history import chunk_writes, rollups, series_scan

    migrate.upgrade(url)
    engine = make_engine(url)
    sf = make_session_factory(engine)
    rng = np.random.default_rng(0)
    with sf.begin() as s:
        ids = [
            jobs.create_job(s, JobSpec.model_validate(SPEC), "bench", "cpu").id for _ in range(2)
        ]
    step_job, layer_job = ids
    autovacuum = Autovacuum(engine, TABLES)
    recorded = len(chunk_writes.STEP_SERIES) - 1  # no world_size on one device
    segments: list[float] = []  # CPU per value of each tenth of the run: the spread
    segment = max(args.batch, args.steps // 10 // args.batch * args.batch)
    for start in range(0, args.steps, segment):
        cpu, n = 0.0, 0
        for first in range(start, min(start + segment, args.steps), args.batch):
            points = step_points(step_job, first, min(args.batch, args.steps - first), rng)
            t = time.process_time()  # making the synthetic values is not the write
            with sf.begin() as s:
                rollups.record(s, points, [])
                autovacuum.send_stats(s, (first + len(points)) * STEP_S)
            cpu += time.process_time() - t
            autovacuum.run((first + len(points)) * STEP_S)
            n += len(points) * recorded
        segments.append(cpu / n * 1e6)
    t0 = time.perf_counter()
    with sf() as s:
        scanned = sum(len(b.values) for b in series_scan.scan_run(s, step_job))
    scan_rate = scanned / (time.perf_counter() - t0)
    steps_written = table_bytes(engine, TABLES)
    steps_bytes = compact(engine, TABLES)
    steps_rollups = table_bytes(engine, BESIDE)
    step_vacuums = autovacuum.vacuums
    autovacuum = Autovacuum(engine, TABLES)  # the layer run's clock starts at 0
    for first in range(0, args.layer_steps, args.batch // 10):
        n = min(args.batch // 10, args.layer_steps - first)
        with sf.begin() as s:
            rollups.record(s, [], layer_values(layer_job, first, n, rng))
            autovacuum.send_stats(s, (first + n) * STEP_S)
        autovacuum.run((first + n) * STEP_S)
    layers_written = table_bytes(engine, TABLES) - steps_bytes
    layers_bytes = compact(engine, TABLES) - steps_bytes
    layers_rollups = table_bytes(engine, BESIDE) - steps_rollups
    engine.dispose()
    db = "postgresql" if url.startswith("postgresql") else "sqlite"
    n_steps, n_layers = args.steps * recorded, args.layer_steps * LAYERS
    for what, written, stored, rolled, vacuums in (
        (
            f"step fields, {args.steps:,} steps",
            steps_written,
            steps_bytes,
            steps_rollups,
            step_vacuums,
        ),
        (
            f"{LAYERS} layer norms, {args.layer_steps:,} steps",
            layers_written,
            layers_bytes,
            layers_rollups,
            autovacuum.vacuums,
        ),
    ):
        n = n_steps if what.startswith("step") else n_layers
        written, stored, rolled = written / n, stored / n, rolled / n
        verdict = (
            "MET" if written <= GOAL else "met once compacted" if stored <= GOAL else "NOT MET"
        )
        held = f" ({vacuums} autovacuums)" if autovacuum.on else ""
        print(
            f"{db:10s} {what:34s} {written:6.2f} B/value as held{held}, {stored:6.2f} "
            f"compacted (of which roll-ups and exemplars {rolled:5.2f}); "
            f"goal <= {GOAL:.0f}: {verdict}",
            flush=True,
        )
    print(
        f"{db:10s} chunk and roll-up writes, us of CPU per step-field value in this process (the "
        f"goal of 1 us is the whole recorder's): {judge('chunk write CPU per value (us)', segments, 1.0).line()}\n"
        f"{db:10s} "
        f"scan_run read {scan_rate / 1e6:.1f} M values/s (wall clock, one series after another)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--layer-steps", type=int, default=4_000)
    parser.add_argument("--batch", type=int, default=1_000, help="steps per transaction")
    parser.add_argument("--pg", default=os.environ.get("AMPTRAIN_TEST_DATABASE_URL"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="amp-size-", dir="/tmp"))
    try:
        measure(f"sqlite:///{root / 'size.db'}", args)
        if args.pg:
            url, drop = throwaway_pg(args.pg)
            try:
                measure(url, args)
            finally:
                drop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
