"""One run of ``bench/recorder_throughput.py`` (in a process of its own, ``--run``): a
private redis-server, the jobs created and claimed, the real recorder's loop in a thread
against a producer process, and the backlog, live and trickle figures it prints."""

from __future__ import annotations

import cProfile
import os
import pstats
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import SPEC, throwaway_pg
from bench.recorder_parts import Parts
from bench.recorder_producer import Producer, step_record
from bench.recorder_servers import Servers

# -- one run (its own process) -------------------------------------------------------------


def _database(kind: str, root: Path, pg: str | None) -> tuple[str, Any]:
    if kind == "sqlite":
        return f"sqlite:///{root / 'amptrain.db'}", None
    assert pg, "no PostgreSQL URL"
    return throwaway_pg(pg)


def one_run(cfg: dict[str, Any]) -> dict[str, Any]:
    """``live``: the recorder runs while the producer publishes; then ``backlog``: the
    producer publishes to fresh jobs with no recorder running, and a new recorder drains."""
    from amptrain.cli.embedded_redis import EmbeddedRedis
    from amptrain.core import redis as core_redis
    from amptrain.store import migrate
    from amptrain.store.db import make_engine, make_session_factory

    if not cfg.get("untuned_gc"):
        _tune_gc()
    root = Path(tempfile.mkdtemp(prefix="amp-rt-", dir="/tmp"))
    server = EmbeddedRedis(root / "redis").start()
    url, drop = _database(cfg["db"], root, cfg.get("pg"))
    try:
        migrate.upgrade(url)
        # The bench polls SQL on a connection of its own: its backend's CPU is left out of
        # the database's (the recorder's engine is the one the sessions use).
        engine = make_engine(url, pool_size=1, max_overflow=0)
        recorder_engine = make_engine(url)
        sf = make_session_factory(recorder_engine)
        # The production client (its connection classes and packing), as the tree has it.
        client = core_redis.client(server.url, 30)
        servers = Servers(server.process.pid if server.process else None, url, engine)
        parts = Parts() if cfg.get("parts") else None
        out = {"live": _live(cfg, server.url, engine, sf, client)}
        out["backlog"] = _backlog(cfg, server.url, engine, sf, client, servers, parts)
        out["trickle"] = _trickle(cfg, engine, sf, client, parts)
        client.close()
        engine.dispose()
        recorder_engine.dispose()
        return out
    finally:
        server.stop()
        if drop:
            drop()
        shutil.rmtree(root, ignore_errors=True)


def _tune_gc() -> None:
    """The garbage collector as a server process of the tree under test tunes it (the API
    did before ``amptrain recorder`` did too: a tree that predates the public name has it
    private)."""
    from amptrain.cli import server

    tune = getattr(server, "tune_gc", None) or getattr(server, "_tune_gc")  # noqa: B009
    tune()


def _jobs(sf: Any, n: int) -> list[tuple[str, int]]:
    from amptrain.contract.spec import JobSpec
    from amptrain.store import jobs

    spec = JobSpec.model_validate(SPEC)
    started = []
    for _ in range(n):
        with sf.begin() as s:
            job_id = jobs.create_job(s, spec, "bench", "cpu").id
        with sf.begin() as s:
            attempt = jobs.claim(s, job_id, "bench-worker", 3600)
        assert attempt is not None
        started.append((job_id, attempt))
    return started


class _Running:
    """The real recorder's production loop in a thread (cProfile'd with --profile, by the
    thread's CPU time: a wait for Redis or the database costs nothing, as in the CPU a
    point; ``BENCH_PROFILE_LINES`` lines of each listing, 40 by default)."""

    def __init__(self, cfg: dict[str, Any], sf: Any, client: Any, n_jobs: int) -> None:
        from amptrain.server.recorder.service import Recorder

        self.rec = Recorder(None, sf, client)
        self.stop = threading.Event()
        self.prof = cProfile.Profile(time.thread_time) if cfg.get("profile") else None
        self.load = os.getloadavg()[0]
        self.thread_cpu = 0.0
        self.started_at = time.time()
        self.thread = threading.Thread(target=self._run, name="recorder")
        self.thread.start()
        self.n_jobs = n_jobs

    def _run(self) -> None:
        cpu0 = time.thread_time()
        if self.prof:
            self.prof.enable()
        self.rec.run(self.stop)
        if self.prof:
            self.prof.disable()
        self.thread_cpu = time.thread_time() - cpu0

    def wait_owned(self) -> None:
        while len(self.rec.owned) < self.n_jobs:
            time.sleep(0.01)

    def finish(self) -> float:
        """Stop; the recorder thread's CPU seconds."""
        self.stop.set()
        self.thread.join(60)
        if self.prof:
            stats = pstats.Stats(self.prof)
            lines = int(os.environ.get("BENCH_PROFILE_LINES", "40"))
            stats.sort_stats("cumulative").print_stats(lines)
            stats.sort_stats("tottime").print_stats(lines)
        return self.thread_cpu


def _wait_persisted(engine: Any, started: list[tuple[str, int]], per_job: int) -> float:
    import sqlalchemy as sa

    from amptrain.store.models import Job

    ids = [j for j, _ in started]
    poll = sa.select(sa.func.count()).where(Job.id.in_(ids), Job.step >= per_job)
    with engine.connect() as conn:
        deadline = time.time() + 1800
        while conn.execute(poll).scalar_one() < len(ids):
            conn.rollback()
            assert time.time() < deadline, "not persisted in time"
            time.sleep(0.005)
    return time.time()


def _stored(engine: Any, started: list[tuple[str, int]]) -> int:
    """The points in SQL: the steps of their cursor series' chunks (the one record of a point
    both trees write; the before tree's rows are the same points)."""
    import sqlalchemy as sa

    q = sa.text(
        "SELECT coalesce(sum(count), 0) FROM metric_chunks WHERE kind = 'step' "
        "AND name = '@ms' AND job_id IN :ids"
    ).bindparams(sa.bindparam("ids", expanding=True))
    with engine.connect() as conn:
        return int(conn.execute(q, {"ids": [j for j, _ in started]}).scalar_one())


def _live(cfg: dict[str, Any], redis_url: str, engine: Any, sf: Any, client: Any) -> dict[str, Any]:
    started = _jobs(sf, cfg["jobs"])
    producer = Producer(redis_url, started, cfg)
    running = _Running(cfg, sf, client, len(started))
    running.wait_owned()  # the recorder is blocked on XREADGROUP for every job: publish
    producer.go()
    done_at = _wait_persisted(engine, started, producer.per_job)
    first_at, last_at = producer.done()
    cpu = running.finish()
    total = producer.per_job * len(started)
    assert _stored(engine, started) == total, "points lost or duplicated"
    return {
        "persist_per_s": total / (done_at - first_at),
        "publish_per_s": total / (last_at - first_at),
        "lag_s": done_at - last_at,
        "cpu_s": cpu,
        "load": running.load,
    }


def _trickle(
    cfg: dict[str, Any], engine: Any, sf: Any, client: Any, parts: Parts | None
) -> dict[str, Any]:
    """One job at 100 steps/s for 3 s (the producer's step points): how long each point
    takes to reach SQL, and the recorder's CPU per point (its loop's idle turns included)
    and, with ``parts``, its chunk writes': each batch holds a few points, and rewrites the
    open chunk of every series."""
    import sqlalchemy as sa

    from amptrain.contract.stream import encode
    from amptrain.core.redis import Keys
    from amptrain.store.models import Job

    ((job_id, attempt),) = _jobs(sf, 1)
    if parts:
        parts.reset()
    running = _Running(cfg, sf, client, 1)
    running.wait_owned()
    published: list[float] = []

    def publish() -> None:
        start = time.perf_counter()
        for step in range(1, 301):
            fields = encode(step_record(step, time.time()), job_id=job_id, attempt=attempt)
            client.xadd(Keys.telemetry(job_id), fields)
            published.append(time.perf_counter())
            time.sleep(max(0.0, start + step * 0.01 - time.perf_counter()))

    thread = threading.Thread(target=publish)
    thread.start()
    seen: dict[int, float] = {}
    q = sa.select(Job.step).where(Job.id == job_id)
    with engine.connect() as conn:
        while len(seen) < 300:
            step = conn.execute(q).scalar_one() or 0
            conn.rollback()
            now = time.perf_counter()
            for k in range(len(seen) + 1, step + 1):
                seen[k] = now
            time.sleep(0.005)
    thread.join()
    cpu = running.finish()
    lags = sorted(seen[k] - published[k - 1] for k in seen)
    chunks = parts.us_per_point(len(seen), cpu).get("chunks") if parts else None
    return {
        "p50_s": lags[len(lags) // 2],
        "max_s": lags[-1],
        "cpu_us": cpu / len(seen) * 1e6,
        "chunks_us": chunks,
    }


def _backlog(
    cfg: dict[str, Any],
    redis_url: str,
    engine: Any,
    sf: Any,
    client: Any,
    servers: Servers,
    parts: Parts | None,
) -> dict[str, Any]:
    started = _jobs(sf, cfg["jobs"])
    producer = Producer(redis_url, started, cfg)
    producer.go()
    producer.done()
    if parts:
        parts.reset()
    servers.start()
    running = _Running(cfg, sf, client, len(started))
    done_at = _wait_persisted(engine, started, producer.per_job)
    cpu = running.finish()
    used = servers.used()
    total = producer.per_job * len(started)
    assert _stored(engine, started) == total, "points lost or duplicated"
    return {
        "persist_per_s": total / (done_at - running.started_at),
        "cpu_s": cpu,
        "us_per_point": {
            "recorder": cpu / total * 1e6,
            "postgres": (used["postgres"] + used["postgres_bg"]) / total * 1e6,
            "postgres_bg": used["postgres_bg"] / total * 1e6,
            "redis": used["redis"] / total * 1e6,
        },
        "load": running.load,
        "parts": parts.us_per_point(total, cpu) if parts else {},
    }
