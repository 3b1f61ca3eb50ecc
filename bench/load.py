"""The service under load: many jobs' telemetry, live watchers and pollers at once, against a
real uvicorn (``amptrain api``), a real private Redis and SQLite or PostgreSQL.

* ``--jobs`` jobs (200) each publish ``--rate`` steps/s (100) through the worker's own
  sink (worker.child.sink.RedisSink), in batches of ``rate * --flush`` steps every
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
import asyncio
import heapq
import json
import multiprocessing as mp
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api.cli.embedded_redis import EmbeddedRedis
from tests.support.stack import Stack, wait_until

SPEC = {
    "name": "load",
    "model": {"name": "mlp", "args": {}},
    "dataset": {"name": "synthetic-classification", "args": {}},
    "device": "cpu",
    "max_steps": 10_000_000,
}


class TracedStack(Stack):
    """A Stack whose API runs under tracemalloc (bench/load_traced_api.py)."""

    def _spawn(self, name: str, args: list[str]) -> Any:
        if name != "api":
            return super()._spawn(name, args)
        import subprocess

        log = open(self.root / "api.log", "ab")  # noqa: SIM115 - lives as long as the process
        script = Path(__file__).with_name("load_traced_api.py")
        proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = proc
        return proc


def pct(values: Any, *qs: float) -> list[float]:
    arr = np.asarray(values, dtype=float)
    return [float(np.percentile(arr, q)) if arr.size else float("nan") for q in qs]


# -- producers -----------------------------------------------------------------------------


def producer_process(
    redis_url: str,
    jobs: list[tuple[int, str, int]],
    rate: float,
    flush_s: float,
    published: Any,
    stop: Any,
) -> None:
    """Each job's sink writes the steps due since the last flush every ``flush_s`` seconds
    (so a producer that falls behind sends bigger batches, like the engine), phases spread
    over the interval so flushes of different jobs do not all land at once."""
    import redis

    from trainer_core.contract.records import metric
    from worker.child.sink import RedisSink

    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    sinks = {i: RedisSink(client, job_id, attempt) for i, job_id, attempt in jobs}
    t0 = time.monotonic()
    due = [(t0 + flush_s * k / len(jobs), i) for k, (i, _, _) in enumerate(jobs)]
    heapq.heapify(due)
    sent = dict.fromkeys(sinks, 0)
    while not stop.is_set():
        at, i = heapq.heappop(due)
        delay = at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        last = int((time.monotonic() - t0) * rate)
        if last > sent[i]:
            now = time.time()
            records = [
                metric(step=s, time=now, loss=1.0 / s, loss_scale=65536.0, skipped_steps=0, lr=0.1)
                for s in range(sent[i] + 1, last + 1)
            ]
            sinks[i].write(records)
            if not sinks[i].unsent:
                sent[i] = last
                published[i] = last
            else:  # Redis refused: the sink keeps them; count them as published once sent
                sent[i] = last
        heapq.heappush(due, (at + flush_s, i))
    client.close()


# -- watchers ------------------------------------------------------------------------------


def watcher_process(
    base: str, token: str, job_ids: list[str], report_s: float, out: Any, stop: Any
):
    asyncio.run(_watchers(base, token, job_ids, report_s, out, stop))


async def _watchers(
    base: str, token: str, job_ids: list[str], report_s: float, out: Any, stop: Any
) -> None:
    import websockets

    window: list[float] = []
    total: list[float] = []
    state = {"lost": 0, "repeated": 0, "drops": 0, "messages": 0}

    async def one(job_id: str) -> None:
        last_step = 0
        cursor: str | None = None
        while not stop.is_set():
            query = f"?after={cursor}" if cursor else ""
            try:
                async with websockets.connect(
                    f"{base}/jobs/{job_id}/ws{query}",
                    additional_headers={"Authorization": f"Bearer {token}"},
                    open_timeout=60,
                    max_queue=None,
                ) as ws:
                    async for raw in ws:
                        now = time.time()
                        msg = json.loads(raw)
                        cursor = msg.get("cursor") or cursor
                        if msg["type"] != "metric":
                            continue
                        step = msg["data"]["step"]
                        state["messages"] += 1
                        if step <= last_step:
                            state["repeated"] += 1
                            continue
                        state["lost"] += step - last_step - 1
                        last_step = step
                        window.append(now - msg["data"]["time"])
                        if stop.is_set():
                            return
            except (TimeoutError, OSError, websockets.WebSocketException):
                pass
            state["drops"] += 1  # closed by the server (e.g. 1013 overflow): resume from cursor
            await asyncio.sleep(0.5)

    async def reporter() -> None:
        while not stop.is_set():
            await asyncio.sleep(report_s)
            batch, window[:] = list(window), []
            total.extend(batch)
            out.put(("watch", window_stats(batch), dict(state)))

    tasks = [asyncio.create_task(one(j)) for j in job_ids]
    rep = asyncio.create_task(reporter())
    while not stop.is_set():
        await asyncio.sleep(0.2)
    rep.cancel()
    total.extend(window)
    out.put(("watch-final", window_stats(total), dict(state)))
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def window_stats(latencies_s: list[float]) -> dict[str, float]:
    p50, p95, p99 = pct(np.asarray(latencies_s) * 1000, 50, 95, 99)
    return {"n": len(latencies_s), "p50": p50, "p95": p95, "p99": p99}


# -- pollers and the probe ------------------------------------------------------------------


def poller_process(
    base: str, token: str, job_ids: list[str], every_s: float, report_s: float, out: Any, stop: Any
) -> None:
    asyncio.run(_pollers(base, token, job_ids, every_s, report_s, out, stop))


async def _pollers(
    base: str, token: str, job_ids: list[str], every_s: float, report_s: float, out: Any, stop: Any
) -> None:
    import httpx

    window: list[float] = []
    total: list[float] = []
    errors = [0]
    limits = httpx.Limits(max_connections=len(job_ids), max_keepalive_connections=len(job_ids))
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30, limits=limits
    ) as client:

        async def one(job_id: str) -> None:
            await asyncio.sleep(random.uniform(0, every_s))
            while not stop.is_set():
                start = time.perf_counter()
                try:
                    r = await client.get(f"/jobs/{job_id}")
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                window.append(time.perf_counter() - start)
                errors[0] += not ok
                await asyncio.sleep(random.uniform(0.75 * every_s, 1.25 * every_s))

        async def reporter() -> None:
            while not stop.is_set():
                await asyncio.sleep(report_s)
                batch, window[:] = list(window), []
                total.extend(batch)
                out.put(("poll", window_stats(batch), {"errors": errors[0]}))

        tasks = [asyncio.create_task(one(j)) for j in job_ids]
        rep = asyncio.create_task(reporter())
        while not stop.is_set():
            await asyncio.sleep(0.2)
        rep.cancel()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    total.extend(window)
    out.put(("poll-final", window_stats(total), {"errors": errors[0]}))


def probe_process(
    base: str, token: str, job_ids: list[str], pause_s: float, report_s: float, out: Any, stop: Any
) -> None:
    """``GET /jobs?limit=20`` then ``GET /jobs/{random id}``, one after the other, forever."""
    import httpx

    routes = ("list", "get")
    window: dict[str, list[float]] = {r: [] for r in routes}
    total: dict[str, list[float]] = {r: [] for r in routes}
    errors = 0
    reported = time.monotonic()
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        while not stop.is_set():
            for route, path in (
                ("list", "/jobs?limit=20"),
                ("get", f"/jobs/{random.choice(job_ids)}"),
            ):
                start = time.perf_counter()
                try:
                    r = client.get(path)
                    ok = r.status_code == 200 and (
                        route == "get" or len(r.json()["items"]) == min(20, len(job_ids))
                    )
                except httpx.HTTPError:
                    ok = False
                window[route].append(time.perf_counter() - start)
                errors += not ok
            time.sleep(pause_s)
            if time.monotonic() - reported >= report_s:
                reported = time.monotonic()
                for r in routes:
                    total[r].extend(window[r])
                out.put(("probe", {r: window_stats(window[r]) for r in routes}, {"errors": errors}))
                window = {r: [] for r in routes}
    for r in routes:
        total[r].extend(window[r])
    out.put(("probe-final", {r: window_stats(total[r]) for r in routes}, {"errors": errors}))


# -- the database --------------------------------------------------------------------------


class Database:
    """A SQLite file in ``root``, or a throw-away PostgreSQL database (dropped on close)."""

    def __init__(self, kind: str, root: Path, pg_url: str | None) -> None:
        import sqlalchemy as sa

        self.admin: sa.Engine | None = None
        if kind == "sqlite":
            self.url = f"sqlite:///{root / 'amptrain.db'}"
            return
        if not pg_url:
            sys.exit("--database postgresql needs --pg URL or AMPTRAIN_TEST_DATABASE_URL")
        admin_url = sa.make_url(pg_url)
        self.name = f"amptrain_load_{uuid.uuid4().hex[:10]}"
        self.admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{self.name}"'))
        self.url = admin_url.set(database=self.name).render_as_string(hide_password=False)

    def close(self) -> None:
        import sqlalchemy as sa

        if self.admin is not None:
            with self.admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
            self.admin.dispose()


def claim_all(db_url: str, redis_url: str, job_ids: list[str], lease_s: float) -> list[int]:
    """Claim every job like a supervisor (fenced attempt, ``started`` event), as
    tests.support.producer.Producer.start does, with one engine and one client."""
    import redis

    from api.store import jobs
    from api.store.db import make_engine, make_session_factory
    from worker.pool.events import LifecycleEvents

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


class Sampler:
    """RSS and CPU of the API process (with its children) and of Redis, plus SQL steps."""

    def __init__(self, api_pid: int, redis_pid: int, db_url: str, job_ids: list[str]) -> None:
        import sqlalchemy as sa

        from api.store.db import make_engine

        self.api = psutil.Process(api_pid)
        self.redis = psutil.Process(redis_pid)
        self.engine = make_engine(db_url)
        self.job_ids = job_ids
        self.query = sa.text("SELECT id, step FROM jobs WHERE status = 'running'")
        self.rss: list[tuple[float, float]] = []
        self.t0 = time.monotonic()
        self.cpu_mark = (self.t0, self._cpu(self.api), self._cpu(self.redis))
        self.bench = psutil.Process()
        self.bench_mark = (self.t0, 0.0)
        self.bench_cpu()

    def _procs(self, p: psutil.Process) -> list[psutil.Process]:
        return [p, *p.children(recursive=True)]

    def _cpu(self, p: psutil.Process) -> float:
        return sum(sum(q.cpu_times()[:2]) for q in self._procs(p))

    def sample_rss(self) -> float:
        mib = sum(q.memory_info().rss for q in self._procs(self.api)) / 2**20
        self.rss.append((time.monotonic() - self.t0, mib))
        return mib

    def cpu(self) -> tuple[float, float]:
        """Cores busy (API, Redis) since the previous call."""
        now, api, red = time.monotonic(), self._cpu(self.api), self._cpu(self.redis)
        t, a, r = self.cpu_mark
        self.cpu_mark = (now, api, red)
        return (api - a) / (now - t), (red - r) / (now - t)

    def bench_cpu(self) -> float:
        """Cores busy in this benchmark's own processes (producers and clients)."""
        now, cpu = (
            time.monotonic(),
            self._cpu(self.bench) - self._cpu(self.api) - self._cpu(self.redis),
        )
        t, c = self.bench_mark
        self.bench_mark = (now, cpu)
        return (cpu - c) / (now - t)

    def sql_steps(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            return {row.id: row.step for row in conn.execute(self.query)}

    def rss_summary(self, last_s: float) -> str:
        t = np.array([x for x, _ in self.rss])
        m = np.array([y for _, y in self.rss])
        tail = t >= t[-1] - last_s
        slope = float(np.polyfit(t[tail] / 60, m[tail], 1)[0]) if tail.sum() > 2 else float("nan")
        return (
            f"API RSS MiB start {m[0]:.0f} min {m.min():.0f} max {m.max():.0f} end {m[-1]:.0f}; "
            f"slope over the last {last_s / 60:.1f} min {slope:+.2f} MiB/min"
        )


def lag_line(published: Any, job_ids: list[str], sql: dict[str, int], rate: float) -> str:
    lags = np.array([max(0, published[i] - sql.get(j, 0)) for i, j in enumerate(job_ids)])
    pub = sum(published[:])
    rec = sum(sql.get(j, 0) for j in job_ids)
    return (
        f"recorder lag steps: max {lags.max()} p50 {np.percentile(lags, 50):.0f} "
        f"(= {lags.max() / rate:.1f} s / {np.percentile(lags, 50) / rate:.1f} s at {rate:.0f}/s); "
        f"published {pub} recorded {rec}"
    )


def get_line(probe: dict[str, Any] | None, poll: dict[str, Any] | None) -> str:
    parts = []
    if probe:
        for route, name in (("list", "GET /jobs?limit=20"), ("get", "GET /jobs/{id}")):
            s = probe[route]
            parts.append(
                f"{name} p50 {s['p50']:.1f} p95 {s['p95']:.1f} p99 {s['p99']:.1f} ms (n={s['n']})"
            )
    if poll:
        parts.append(
            f"pollers (timed in their own busy client) GET /jobs/{{id}} p50 {poll['p50']:.1f} p95 {poll['p95']:.1f} "
            f"p99 {poll['p99']:.1f} ms (n={poll['n']})"
        )
    return "; ".join(parts)


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
        f"{args.minutes:g} min on {args.database}; {psutil.cpu_count()} cores; folder {root}",
        flush=True,
    )
    try:
        stack.start_api()
        job_ids = [stack.submit(SPEC)["id"] for _ in range(args.jobs)]
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
        sampler = Sampler(stack.processes["api"].pid, redis_server.process.pid, db.url, job_ids)
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
    traced = Path(os.environ.get("AMPTRAIN_LOAD_ROOT", "")) / "tracemalloc.txt"
    if args.tracemalloc:
        wait_until(traced.exists, 300, "the API's tracemalloc report", interval=1.0)
        print(traced.read_text(), flush=True)
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


def report(
    label: str,
    args: Any,
    sampler: Sampler,
    published: Any,
    job_ids: list[str],
    latest: dict[str, Any],
    lag: bool = True,
) -> None:
    load1, load5, _ = os.getloadavg()
    api_cpu, redis_cpu = sampler.cpu()
    lines = [f"[{label}] load average {load1:.1f} (5 min {load5:.1f})"]
    if lag:
        lines.append(lag_line(published, job_ids, sampler.sql_steps(), args.rate))
    probe = latest.get("probe", (None, {}))
    poll = latest.get("poll", (None, {}))
    lines.append(
        get_line(probe[0], poll[0])
        + f"; errors probe {probe[1].get('errors', 0)} pollers {poll[1].get('errors', 0)}"
    )
    lines.append(sampler.rss_summary(last_s=min(240.0, args.minutes * 60 * 0.8)))
    lines.append(
        f"CPU cores busy: API {api_cpu:.2f} Redis {redis_cpu:.2f} "
        f"bench producers+clients {sampler.bench_cpu():.2f}"
    )
    if "watch" in latest:
        w, st = latest["watch"]
        lines.append(
            f"watchers: p50 {w['p50']:.0f} p95 {w['p95']:.0f} p99 {w['p99']:.0f} ms "
            f"(n={w['n']}); lost {st['lost']} repeated {st['repeated']} reconnects {st['drops']}"
        )
    print("\n  ".join(lines), flush=True)


if __name__ == "__main__":
    main()
