"""The service under load: many jobs' telemetry, live watchers and pollers at once, against a
real uvicorn (``amptrain api``), a real private Redis and SQLite or PostgreSQL.

* ``--jobs`` jobs (200) each publish ``--rate`` steps/s (100) through the worker's own
  sink (amptrain.worker.child.sink.RedisSink), in batches of ``rate * --flush`` steps every
  ``--flush`` seconds (10 steps per 100 ms, like the engine's flushes), from
  ``--producers`` processes. The jobs are submitted through the API and claimed in SQL
  like a supervisor claims them, so the API's recorder records them.
* ``--watchers`` WebSocket watchers (50), one each on the first jobs, in one process:
  latency = arrival minus the record's ``time`` (same host clock); lost = steps skipped.
* One poller per job: ``GET /jobs/{id}`` every ~2 s (jittered), in one process; and a
  probe process timing ``GET /jobs?limit=20`` and ``GET /jobs/{id}`` back to back.

The probe's figures are the ones to hold against a latency goal: the 200 pollers share
one asyncio client process whose own queueing shows in theirs.

Every ``--report`` seconds (30) and at the end it prints the recorder lag (newest
published step minus the job's step in SQL, per job: max and p50), GET p50/p95/p99 per
route, the API process's RSS (start/min/max/end and the slope over the last 4 minutes),
API and Redis CPU, the watchers' p99 and lost steps, and the load average (the numbers
mean little on a machine busy with other work).

    python bench/load.py [--minutes 5] [--jobs 200] [--rate 100] [--watchers 50]
                         [--database sqlite|postgresql] [--pg URL] [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amptrain.cli.embedded_redis import EmbeddedRedis
from bench.common import SPEC, throwaway_pg
from bench.load_clients import (
    poller_process,
    probe_process,
    producer_process,
    watcher_process,
)
from bench.load_report import Sampler, lag_line, report
from tests.support.stack import Stack, wait_until


class TracedStack(Stack):
    """A Stack whose API runs under tracemalloc (bench/load_traced_api.py)."""

    def entry(self, name: str) -> list[str]:
        if name != "api":
            return super().entry(name)
        return [sys.executable, str(Path(__file__).with_name("load_traced_api.py"))]


# -- the database --------------------------------------------------------------------------


class Database:
    """A SQLite file in ``root``, or a throw-away PostgreSQL database (dropped on close)."""

    def __init__(self, kind: str, root: Path, pg_url: str | None) -> None:
        self.drop: Callable[[], None] | None = None
        if kind == "sqlite":
            self.url = f"sqlite:///{root / 'amptrain.db'}"
            return
        if not pg_url:
            sys.exit("--database postgresql needs --pg URL or AMPTRAIN_TEST_DATABASE_URL")
        self.url, self.drop = throwaway_pg(pg_url)

    def close(self) -> None:
        if self.drop is not None:
            self.drop()


def claim_all(db_url: str, redis_url: str, job_ids: list[str], lease_s: float) -> list[int]:
    """Claim every job like a supervisor (fenced attempt, ``started`` event), as
    tests.support.producer.Producer.start does, with one engine and one client."""
    import redis

    from amptrain.store import jobs
    from amptrain.store.db import make_engine, make_session_factory
    from amptrain.worker.pool.events import LifecycleEvents

    engine = make_engine(db_url)
    sessions = make_session_factory(engine)
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    attempts = []
    for job_id in job_ids:
        with sessions.begin() as s:
            attempt = jobs.claim(s, job_id, "bench-producer", lease_s)
        assert attempt is not None, f"job {job_id} not claimable"
        LifecycleEvents(client).publish(
            job_id, attempt, "started", 0, {"precision": {"effective": "fp32"}}
        )
        attempts.append(attempt)
    client.close()
    engine.dispose()
    return attempts


# -- the run -------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=100.0, help="steps/s per job")
    parser.add_argument("--flush", type=float, default=0.1, help="seconds between a job's XADDs")
    parser.add_argument("--watchers", type=int, default=50)
    parser.add_argument("--poll-every", type=float, default=2.0)
    parser.add_argument("--producers", type=int, default=4, help="producer processes")
    parser.add_argument("--report", type=float, default=30.0, help="seconds between reports")
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--pg", default=os.environ.get("AMPTRAIN_TEST_DATABASE_URL"))
    parser.add_argument("--quick", action="store_true", help="1 minute, 50 jobs")
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="run the API under tracemalloc and print what grew most (slows the API down)",
    )
    parser.add_argument(
        "--pool-debug",
        action="store_true",
        help="print where the API's checked-out database connections were taken, each report",
    )
    parser.add_argument(
        "--recorder",
        choices=("api", "process"),
        default="api",
        help="the recorder as a thread of the API (default) or as `amptrain recorder` beside it",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (logs, db)")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.report = 50, 15.0
        args.minutes = 1.0 if args.minutes == parser.get_default("minutes") else args.minutes
    args.watchers = min(args.watchers, args.jobs)

    root = Path(tempfile.mkdtemp(prefix="amp-load-", dir="/tmp"))
    os.environ["AMPTRAIN_LOAD_ROOT"] = str(root)
    redis_server = EmbeddedRedis(root / "redis", appendonly=False).start()
    db = Database(args.database, root, args.pg)
    traced = args.tracemalloc or args.pool_debug
    stack = (TracedStack if traced else Stack)(root, db.url, redis_server)
    stack.env.update(
        AMPTRAIN_WRITE_RATE_LIMIT="100000/minute",  # the bench submits its jobs in a burst
        AMPTRAIN_MAX_LIVE_CONNECTIONS_PER_USER="128",  # every watcher uses the admin token
    )
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    children: list[Any] = []
    print(
        f"load: {args.jobs} jobs x {args.rate:.0f} steps/s (batches every {args.flush * 1000:.0f} "
        f"ms), {args.watchers} watchers, {args.jobs} pollers every {args.poll_every:.0f} s, "
        f"{args.minutes:g} min on {args.database}, recorder in {args.recorder}; "
        f"{psutil.cpu_count()} cores; folder {root}",
        flush=True,
    )
    if args.recorder == "process":
        stack.env["AMPTRAIN_RECORDER_IN_API"] = "false"
    try:
        stack.start_api()
        if args.recorder == "process":
            stack.spawn("recorder", ["recorder"])
        job_ids = [stack.submit({**SPEC, "name": "load"})["id"] for _ in range(args.jobs)]
        duration = args.minutes * 60
        attempts = claim_all(db.url, redis_server.url, job_ids, lease_s=duration + 900)
        published = ctx.Array("q", args.jobs, lock=False)
        out = ctx.Queue()
        base = f"http://127.0.0.1:{stack.port}"
        indexed = [(i, j, a) for i, (j, a) in enumerate(zip(job_ids, attempts, strict=True))]
        for k in range(args.producers):
            share = indexed[k :: args.producers]
            children.append(
                ctx.Process(
                    target=producer_process,
                    args=(redis_server.url, share, args.rate, args.flush, published, stop),
                )
            )
        children.append(
            ctx.Process(
                target=watcher_process,
                args=(
                    base.replace("http", "ws"),
                    stack.token,
                    job_ids[: args.watchers],
                    args.report,
                    out,
                    stop,
                ),
            )
        )
        children.append(
            ctx.Process(
                target=poller_process,
                args=(base, stack.token, job_ids, args.poll_every, args.report, out, stop),
            )
        )
        children.append(
            ctx.Process(
                target=probe_process,
                args=(base, stack.token, job_ids, 0.05, args.report, out, stop),
            )
        )
        assert redis_server.process is not None
        services = {"API": stack.processes["api"].pid, "Redis": redis_server.process.pid}
        if args.recorder == "process":
            services["recorder"] = stack.processes["recorder"].pid
        sampler = Sampler(services, db.url, job_ids)
        for c in children:
            c.start()
        run(args, sampler, published, job_ids, out, stop, duration)
    finally:
        stop.set()
        for c in children:
            c.join(30)
            if c.is_alive():
                c.kill()
        stack.close()
        redis_server.stop()
        db.close()
        if not args.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)


def run(
    args: Any,
    sampler: Sampler,
    published: Any,
    job_ids: list[str],
    out: Any,
    stop: Any,
    duration: float,
) -> None:
    latest: dict[str, Any] = {}
    start = time.monotonic()
    next_report = start + args.report
    while time.monotonic() - start < duration:
        time.sleep(1.0)
        sampler.sample_rss()
        while not out.empty():
            kind, stats, extra = out.get()
            latest[kind] = (stats, extra)
        if time.monotonic() >= next_report:
            next_report += args.report
            if args.pool_debug:
                os.kill(sampler.api.pid, signal.SIGUSR2)
            if args.tracemalloc and time.monotonic() - start < 1.5 * args.report:
                os.kill(sampler.api.pid, signal.SIGUSR1)  # starts tracing (after start-up)
            report(f"t={time.monotonic() - start:4.0f}s", args, sampler, published, job_ids, latest)
    if args.tracemalloc:
        os.kill(sampler.api.pid, signal.SIGUSR1)  # what grew since tracing started
    stop.set()
    sql_at_stop = sampler.sql_steps()
    final: dict[str, Any] = {}
    deadline = time.monotonic() + 60
    while len(final) < 3 and time.monotonic() < deadline:
        kind, stats, extra = out.get(timeout=60)
        if kind.endswith("-final"):
            final[kind.removesuffix("-final")] = (stats, extra)
    print("== whole run ==", flush=True)
    folder = Path(os.environ.get("AMPTRAIN_LOAD_ROOT", ""))
    if args.tracemalloc:
        traced = folder / "tracemalloc.txt"
        wait_until(traced.exists, 300, "the API's tracemalloc report", interval=1.0)
        print(traced.read_text(), flush=True)
    if args.pool_debug and (folder / "checkouts.txt").exists():
        print("where the API's connections were taken, at each report:", flush=True)
        print((folder / "checkouts.txt").read_text(), flush=True)
    print("  " + lag_line(published, job_ids, sql_at_stop, args.rate), flush=True)
    report("end", args, sampler, published, job_ids, final, lag=False)
    target = dict(enumerate(published[:]))
    caught = time.monotonic()
    while time.monotonic() - caught < 120:
        sql = sampler.sql_steps()
        if all(sql.get(j, 0) >= target[i] for i, j in enumerate(job_ids)):
            print(
                f"  recorder caught up {time.monotonic() - caught:.1f} s after the producers stopped"
            )
            break
        time.sleep(0.5)
    else:
        print("  recorder still behind 120 s after the producers stopped", flush=True)


if __name__ == "__main__":
    main()
