"""Storage per recorded value: what a history costs in SQL, the chunks (``metric_chunks``),
their roll-ups (``metric_rollups``) and exemplars (``metric_exemplars``), indexes included,
on SQLite (the ``dbstat`` pages of each table and index) and PostgreSQL
(``pg_total_relation_size``: heap, TOAST and indexes).

Three runs, each a job, per database, written by the recorder's own write
(:func:`amptrain.store.history.rollups.record`: chunks, roll-ups and exemplars, one
transaction a batch, as the recorder's) from :mod:`bench.storage_data`'s synthetic values:

* the step fields of ``--steps`` steps (default 1,000,000) in batches of ``--batch`` (1,000:
  a recorder catching up): every value the run records (a one-device run records no
  ``world_size``: its all-null chunks count as overhead);
* the step fields of ``--live-steps`` steps (50,000) in batches of ``--live-batch`` (10: a
  live job at 40 steps a second, which the recorder writes every ~0.25 s), so each open
  chunk is rewritten ~25 times;
* 256 layer norms at every step of ``--layer-steps`` steps (4,000) in batches of
  ``--layer-batch`` (10, live).

"As held" is what the database holds at the end of the run: on PostgreSQL with autovacuum
doing during the run what a server's does, by the run's own clock (40 steps a second; see
:mod:`bench.autovacuum`: the same lazy ``VACUUM`` at each naptime for the tables past their
thresholds, the tables' storage parameters included); SQLite reuses freed pages itself.
"Compacted" is after ``VACUUM FULL`` / ``VACUUM``: the floor, not what a server holds.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.autovacuum import Autovacuum
from bench.common import SPEC, judge, throwaway_pg
from bench.storage_data import LAYERS, STEP_S, layer_values, step_points
from bench.table_size import compact, table_bytes

GOAL = 8.0
TABLES = ["metric_chunks", "metric_rollups", "metric_exemplars"]
BESIDE = TABLES[1:]
"""What the reads need beside the chunks: the roll-ups and their blocks' exemplars."""


@dataclass(frozen=True)
class Leg:
    """One run written and measured: bytes per value as held and compacted."""

    what: str
    held: float
    compacted: float
    beside: float
    """Of ``compacted``, the roll-ups and exemplars."""
    overhead_mib: float
    """What the tables held beyond their compacted size at the end of the run."""
    vacuums: int


Make = Callable[[str, int, int], tuple[list[dict[str, Any]], list[dict[str, Any]]]]
"""``make(job_id, first, n)``: the points and named values of steps ``first .. first + n - 1``."""


def run_leg(
    url: str,
    what: str,
    make: Make,
    steps: int,
    batch: int,
    per_step: int,
    segments: list[float] | None = None,
) -> tuple[Leg, float]:
    """In the empty database ``url``, one job's ``steps`` steps from ``make`` written through
    the recorder's write in transactions of ``batch`` steps, autovacuum running by the run's
    clock; ``segments`` gets the write's CPU per value of each tenth of the run. The leg,
    and how fast :func:`~amptrain.store.history.series_scan.scan_run` reads it back."""
    from amptrain.contract.spec import JobSpec
    from amptrain.store import jobs, migrate
    from amptrain.store.db import make_engine, make_session_factory
    from amptrain.store.history import rollups, series_scan

    migrate.upgrade(url)
    engine = make_engine(url)
    sf = make_session_factory(engine)
    with sf.begin() as s:
        job_id = jobs.create_job(s, JobSpec.model_validate(SPEC), "bench", "cpu").id
    # A database of its own per run: what it holds is the run's alone (a compaction of
    # earlier runs' rows, which another database's open transaction may have delayed, does
    # not land in this one's figures).
    base, base_beside = table_bytes(engine, TABLES), table_bytes(engine, BESIDE)
    autovacuum = Autovacuum(engine, TABLES)
    tenth = max(batch, steps // 10 // batch * batch)
    cpu, in_tenth = 0.0, 0
    for first in range(0, steps, batch):
        n = min(batch, steps - first)
        points, values = make(job_id, first, n)
        t = time.process_time()  # making the synthetic values is not the write
        with sf.begin() as s:
            rollups.record(s, points, values)
            autovacuum.send_stats(s, (first + n) * STEP_S)
        cpu += time.process_time() - t
        autovacuum.run((first + n) * STEP_S)
        in_tenth += n
        if segments is not None and (in_tenth == tenth or first + n == steps):
            segments.append(cpu / in_tenth / per_step * 1e6)
            cpu, in_tenth = 0.0, 0
    held = table_bytes(engine, TABLES) - base
    t0 = time.perf_counter()
    with sf() as s:
        scanned = sum(len(b.values) for b in series_scan.scan_run(s, job_id))
    scan_rate = scanned / (time.perf_counter() - t0)
    compacted = compact(engine, TABLES) - base
    beside = table_bytes(engine, BESIDE) - base_beside
    engine.dispose()
    n_values = steps * per_step
    leg = Leg(
        what,
        held / n_values,
        compacted / n_values,
        beside / n_values,
        (held - compacted) / 2**20,
        autovacuum.vacuums,
    )
    return leg, scan_rate


def measure(fresh: Callable[[], Any], db: str, args: argparse.Namespace) -> None:
    """The three runs, each in a database from ``fresh()`` (a context manager of its URL)."""
    from amptrain.store.history import chunk_writes

    rng = np.random.default_rng(0)
    recorded = len(chunk_writes.STEP_SERIES) - 1  # no world_size on one device
    segments: list[float] = []  # CPU per value of each tenth of the run: the spread
    runs: list[tuple[str, Make, int, int, int]] = [
        (
            f"step fields, {args.steps:,} steps in batches of {args.batch:,}",
            lambda job, first, n: (step_points(job, first, n, rng), []),
            args.steps,
            args.batch,
            recorded,
        ),
        (
            f"step fields, {args.live_steps:,} steps in batches of {args.live_batch:,}",
            lambda job, first, n: (step_points(job, first, n, rng), []),
            args.live_steps,
            args.live_batch,
            recorded,
        ),
        (
            f"{LAYERS} layer norms, {args.layer_steps:,} steps in batches of {args.layer_batch:,}",
            lambda job, first, n: ([], layer_values(job, first, n, rng)),
            args.layer_steps,
            args.layer_batch,
            LAYERS,
        ),
    ]
    scan_rate = 0.0
    for i, (what, make, steps, batch, per_step) in enumerate(runs):
        if not steps:
            continue
        with fresh() as url:
            leg, rate = run_leg(
                url, what, make, steps, batch, per_step, segments if i == 0 else None
            )
        scan_rate = scan_rate or rate
        verdict = (
            "MET"
            if leg.held <= GOAL
            else "met once compacted"
            if leg.compacted <= GOAL
            else "NOT MET"
        )
        vacuums = f" ({leg.vacuums} autovacuums)" if db == "postgresql" else ""
        print(
            f"{db:10s} {leg.what:52s} {leg.held:6.2f} B/value as held{vacuums} "
            f"({leg.overhead_mib:.1f} MiB over compacted), {leg.compacted:5.2f} compacted "
            f"(roll-ups and exemplars {leg.beside:4.2f}); goal <= {GOAL:.0f}: {verdict}",
            flush=True,
        )
    if segments:  # the first run was not left out (--steps 0)
        cpu = judge("chunk write CPU per value (us)", segments, 1.0).line()
        print(
            f"{db:10s} chunk and roll-up writes of the first run, us of CPU per step-field "
            f"value in this process (the goal of 1 us is the whole recorder's): {cpu}"
        )
    print(
        f"{db:10s} "
        f"scan_run read {scan_rate / 1e6:.1f} M values/s (wall clock, one series after another)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1_000, help="steps per transaction")
    parser.add_argument("--live-steps", type=int, default=50_000)
    parser.add_argument(
        "--live-batch", type=int, default=10, help="steps per transaction of the live runs"
    )
    parser.add_argument("--layer-steps", type=int, default=4_000)
    parser.add_argument("--layer-batch", type=int, default=10)
    parser.add_argument("--pg", default=os.environ.get("AMPTRAIN_TEST_DATABASE_URL"))
    parser.add_argument(
        "--databases", default="sqlite,postgresql", help="which to measure (postgresql: --pg)"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="amp-size-", dir="/tmp"))
    files = iter(range(1_000))

    @contextmanager
    def sqlite_file() -> Iterator[str]:
        yield f"sqlite:///{root / f'size-{next(files)}.db'}"

    @contextmanager
    def pg_database() -> Iterator[str]:
        url, drop = throwaway_pg(args.pg)
        try:
            yield url
        finally:
            drop()

    try:
        if "sqlite" in args.databases:
            measure(sqlite_file, "sqlite", args)
        if args.pg and "postgresql" in args.databases:
            measure(pg_database, "postgresql", args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
