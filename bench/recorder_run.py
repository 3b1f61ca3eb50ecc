"""One run of ``bench/recorder_throughput.py`` (in a process of its own, ``--run``): a
private redis-server, the jobs created and claimed, the real recorder's loop in a thread
against a producer process, and the backlog, live and trickle figures it prints."""

from __future__ import annotations

import cProfile
import multiprocessing as mp
import os
import pstats
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import SPEC, throwaway_pg
from bench.recorder_parts import Parts

# -- the producer process ------------------------------------------------------------------


def step_record(step: int, now: float) -> dict[str, Any]:
    """The step point every job publishes: a training step's fields as the engine fills
    them on a CPU (no allocator figures)."""
    from amptrain.contract.records import metric

    return metric(
        step=step,
        time=now,
        loss=1.0 / step,
        loss_scale=65536.0,
        skipped=False,
        grad_norm=0.5,
        lr=0.1,
        memory_peak=1000 + step,
        samples_per_second=512.0,
        step_time_ms=3.0,
        skipped_steps=0,
    )


def values_per_point() -> int:
    """The values a step point records: its fields that hold one (step and time count,
    as the issue counts "an 11-value step point")."""
    from amptrain.contract.metrics import METRIC_FIELDS

    record = step_record(1, time.time())
    return sum(record.get(f) is not None for f in METRIC_FIELDS)


def produce(
    redis_url: str, started: list[tuple[str, int]], per_job: int, batch: int, q: Any, go: Any
) -> None:
    """Publish ``per_job`` points to every job, round-robin, ``batch`` at a time: the sink's
    own entry format and XADD (``MAXLEN ~``), encoded before the clock starts so that the
    producer outruns the recorder on two cores."""
    import redis

    from amptrain.contract.stream import STREAM_MAXLEN, encode
    from amptrain.core.redis import Keys

    client = redis.Redis.from_url(redis_url, socket_timeout=30)
    now = time.time()
    encoded = {
        job_id: [
            encode(step_record(i, now), job_id=job_id, attempt=attempt)
            for i in range(1, per_job + 1)
        ]
        for job_id, attempt in started
    }
    q.put("ready")
    go.get()
    first_at = time.time()
    for first in range(0, per_job, batch):
        for job_id, fields in encoded.items():
            pipe = client.pipeline(transaction=False)
            for f in fields[first : first + batch]:
                pipe.xadd(Keys.telemetry(job_id), f, maxlen=STREAM_MAXLEN, approximate=True)  # type: ignore[arg-type]
            pipe.execute()
    q.put((first_at, time.time()))


# -- one run (its own process) -------------------------------------------------------------


def _database(kind: str, root: Path, pg: str | None) -> tuple[str, Any]:
    if kind == "sqlite":
        return f"sqlite:///{root / 'amptrain.db'}", None
    assert pg, "no PostgreSQL URL"
    return throwaway_pg(pg)


def one_run(cfg: dict[str, Any]) -> dict[str, Any]:
    """``live``: the recorder runs while the producer publishes; then ``backlog``: the
    producer publishes to fresh jobs with no recorder running, and a new recorder drains."""
    import redis

    from amptrain.cli.embedded_redis import EmbeddedRedis
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
        client = redis.Redis.from_url(server.url, socket_timeout=30)
        servers = _Servers(server.process.pid if server.process else None, url, engine)
        parts = Parts() if cfg.get("parts") else None
        out = {"live": _live(cfg, server.url, engine, sf, client)}
        out["backlog"] = _backlog(cfg, server.url, engine, sf, client, servers, parts)
        out["trickle"] = _trickle(cfg, engine, sf, client)
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

    tune = getattr(server, "tune_gc", None) or server._tune_gc
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


class _Producer:
    def __init__(self, redis_url: str, started: list[tuple[str, int]], cfg: dict[str, Any]) -> None:
        ctx = mp.get_context("spawn")
        self.q, self.go_q = ctx.Queue(), ctx.Queue()
        self.per_job = cfg["points"] // cfg["jobs"]
        args = (redis_url, started, self.per_job, cfg["batch"], self.q, self.go_q)
        self.proc = ctx.Process(target=produce, args=args, daemon=True)
        self.proc.start()
        assert self.q.get(timeout=300) == "ready"

    def go(self) -> None:
        self.go_q.put("go")

    def done(self) -> tuple[float, float]:
        first_at, last_at = self.q.get(timeout=1800)
        self.proc.join(30)
        return first_at, last_at


class _Running:
    """The real recorder's production loop in a thread (cProfile'd with --profile)."""

    def __init__(self, cfg: dict[str, Any], sf: Any, client: Any, n_jobs: int) -> None:
        from amptrain.server.recorder.service import Recorder

        kwargs = {"insert_method": cfg["method"]} if cfg["method"] else {}
        self.rec = Recorder(None, sf, client, **kwargs)
        self.stop = threading.Event()
        self.prof = cProfile.Profile() if cfg.get("profile") else None
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
            stats.sort_stats("cumulative").print_stats(40)
            stats.sort_stats("tottime").print_stats(20)
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
    import sqlalchemy as sa

    from amptrain.store.models import MetricPoint

    q = sa.select(sa.func.count()).where(MetricPoint.job_id.in_([j for j, _ in started]))
    with engine.connect() as conn:
        return int(conn.execute(q).scalar_one())


def _live(cfg: dict[str, Any], redis_url: str, engine: Any, sf: Any, client: Any) -> dict[str, Any]:
    started = _jobs(sf, cfg["jobs"])
    producer = _Producer(redis_url, started, cfg)
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


def _trickle(cfg: dict[str, Any], engine: Any, sf: Any, client: Any) -> dict[str, Any]:
    """One job at 100 steps/s for 3 s: how long each point takes to reach SQL."""
    import sqlalchemy as sa

    from amptrain.contract.records import metric
    from amptrain.contract.stream import encode
    from amptrain.core.redis import Keys
    from amptrain.store.models import Job

    ((job_id, attempt),) = _jobs(sf, 1)
    running = _Running(cfg, sf, client, 1)
    running.wait_owned()
    published: list[float] = []

    def publish() -> None:
        start = time.perf_counter()
        for step in range(1, 301):
            fields = encode(
                metric(step=step, time=time.time(), loss=1.0), job_id=job_id, attempt=attempt
            )
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
    running.finish()
    lags = sorted(seen[k] - published[k - 1] for k in seen)
    return {"p50_s": lags[len(lags) // 2], "max_s": lags[-1]}


class _Servers:
    """CPU seconds of the redis-server, of the PostgreSQL backends serving the bench's
    database (its name is in their process title) and of the server's background processes
    (WAL writer, checkpointer, background writer, autovacuum, the postmaster): the
    database's work includes what they do for it. The server may be shared (other test
    runs on this machine): the background processes then count their work too, so the
    figure is an upper bound."""

    def __init__(self, redis_pid: int | None, url: str, poller: Any) -> None:
        import sqlalchemy as sa

        self.redis_pid = redis_pid
        self.database = sa.make_url(url).database if url.startswith("postgresql") else None
        self.before: dict[int, float] = {}
        self.poller_pid = None
        if self.database:
            with poller.connect() as conn:
                self.poller_pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()

    def _cpu(self) -> dict[int, tuple[str, float]]:
        import psutil

        found: dict[int, tuple[str, float]] = {}
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                line = " ".join(p.info["cmdline"] or [])
                if p.pid == self.poller_pid:
                    continue  # the bench's own polling, not the recorder's work
                if p.pid == self.redis_pid:
                    kind = "redis"
                elif self.database and line.startswith("postgres:") and self.database in line:
                    kind = "postgres"
                elif self.database and _postgres_background(p.info["cmdline"] or []):
                    kind = "postgres_bg"
                else:
                    continue
                found[p.pid] = (kind, sum(p.cpu_times()[:2]))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def start(self) -> None:
        self.before = {pid: cpu for pid, (_, cpu) in self._cpu().items()}

    def used(self) -> dict[str, float]:
        out = {"redis": 0.0, "postgres": 0.0, "postgres_bg": 0.0}
        for pid, (kind, cpu) in self._cpu().items():
            out[kind] += cpu - self.before.get(pid, 0.0)
        return out


_BACKGROUND = re.compile(
    r"postgres: (?:[^:]+: )?(?:checkpointer|background writer|walwriter|autovacuum|logical)"
)
"""A helper's process title; a server with a ``cluster_name`` (Debian's ``15/main``) puts
it after ``postgres:``, so a bare ``postgres: walwriter`` match missed every helper."""


def _postgres_background(cmdline: list[str]) -> bool:
    """A PostgreSQL server's own process: the postmaster or one of its helpers."""
    line = " ".join(cmdline)
    if line.startswith("postgres: "):
        return _BACKGROUND.match(line) is not None
    return bool(cmdline) and Path(cmdline[0]).name in ("postgres", "postmaster")


def _backlog(
    cfg: dict[str, Any],
    redis_url: str,
    engine: Any,
    sf: Any,
    client: Any,
    servers: _Servers,
    parts: Parts | None,
) -> dict[str, Any]:
    started = _jobs(sf, cfg["jobs"])
    producer = _Producer(redis_url, started, cfg)
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
