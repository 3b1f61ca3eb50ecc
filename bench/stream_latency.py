"""Live telemetry latency and throughput against a real uvicorn (``amptrain api``), a real
private Redis and SQLite or PostgreSQL (``--database sqlite,postgresql``: each in turn,
PostgreSQL on a throw-away database of ``--pg``, default ``AMPTRAIN_TEST_DATABASE_URL``).

1. Fan-out: a producer publishes through the worker's own publisher (amptrain.worker.child.sink.
   RedisSink, one XADD per step) at ``--rate`` steps/s while 1, 100 and 500 WebSocket
   watchers (in ``--procs`` client processes) follow the job. Latency = arrival at the
   client minus the record's ``time`` field (set when the record is created; same host
   clock). The watchers are lean (:mod:`bench.lean_watcher`: websockets' sans-I/O
   client on a raw uvloop protocol, one JSON decode per distinct frame per process),
   so the two cores go to the server: ``websockets.connect`` clients took about one
   core of the two themselves and inflated 1,000 watchers' p99 to seconds. Reports
   p50/p99/max and messages lost or repeated per watcher. With
   ``--batch`` (the default) each watcher count runs twice, one message per record
   (``single``, today's clients) and batch frames (``?batch=true``), printed side by side.
2. Throughput: one publisher pushes ``--records`` records as fast as it can in batches
   of ``--publish-batch`` (like the engine's flushes); the API's recorder persists them. Reports
   the publish rate, the persist rate (records / time until SQL holds the last step)
   and so the largest step rate that runs without a growing recorder lag.

CPU figures count every process doing the work: the API's process tree (the recorder and
the live hub run in it), the redis-server, and on PostgreSQL every PostgreSQL process
(backends, WAL writer, checkpointer: :func:`bench.common.postgres_cpu`, so run it on a
server no one else is loading).

    python bench/stream_latency.py [--watchers 1,100,500] [--seconds 10] [--rate 100]
                                   [--no-batch] [--quick] [--database sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.records import metric
from bench.common import SPEC, postgres_cpu, throwaway_pg, tree_cpu
from bench.lean_watcher import watch
from tests.support.producer import Producer
from tests.support.stack import Stack, wait_until

# -- watcher processes ---------------------------------------------------------------------


def _decode(raw: bytes) -> tuple[str, list[tuple[int, float]]]:
    """A message's type and its metric records' (step, time)."""
    msg = json.loads(raw)
    records = msg["items"] if msg["type"] == "batch" else [msg]
    return msg["type"], [
        (r["data"]["step"], r["data"]["time"]) for r in records if r["type"] == "metric"
    ]


def client_process(url: str, token: str, n: int, ready: Any, out: str) -> None:
    uvloop.run(_clients(url, token, n, ready, out))


async def _clients(url: str, token: str, n: int, ready: Any, out: str) -> None:
    connected = asyncio.Event()
    count = [0]
    # Watchers at the same position get byte-identical frames: one JSON decode serves all
    # of this process's copies, so the clients' CPU goes to receiving, not to json.loads.
    decoded: dict[bytes, tuple[str, list[tuple[int, float]]]] = {}

    async def one() -> dict[str, Any]:
        arrivals: list[tuple[float, list[tuple[int, float]]]] = []
        last = ["dropped"]

        def on_message(raw: bytes, now: float) -> bool:
            if not arrivals:  # the server has set this watcher up
                count[0] += 1
                if count[0] == n:
                    connected.set()
            message = decoded.get(raw)
            if message is None:
                if len(decoded) > 10_000:
                    decoded.clear()
                message = decoded[raw] = _decode(raw)
            arrivals.append((now, message[1]))
            if message[0] in ("end", "gap"):
                last[0] = message[0]
                return True
            return False

        await watch(url, token, on_message)
        return {
            "steps": [step for _, points in arrivals for step, _ in points],
            "lat": [now - made for now, points in arrivals for _, made in points],
            "last": last[0],
            "frames": len(arrivals),
        }

    tasks = [asyncio.create_task(one()) for _ in range(n)]
    await connected.wait()
    ready.put(n)
    results = await asyncio.gather(*tasks)
    Path(out).write_text(json.dumps(results))


# -- the runs ------------------------------------------------------------------------------


def fan_out(
    stack: Stack, redis_url: str, db_url: str, watchers: int, args: Any, batch: bool
) -> dict[str, Any]:
    job = stack.submit(SPEC)
    producer = Producer(redis_url, db_url, job["id"])
    producer.start()
    url = f"ws://127.0.0.1:{stack.port}/jobs/{job['id']}/ws" + ("?batch=true" if batch else "")
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    procs = min(args.procs, watchers)
    shares = [watchers // procs + (1 if i < watchers % procs else 0) for i in range(procs)]
    mode = "batch" if batch else "single"
    outs = [str(Path(stack.root) / f"w{watchers}-{mode}-{i}.json") for i in range(procs)]
    children = [
        ctx.Process(target=client_process, args=(url, stack.token, k, ready, o))
        for k, o in zip(shares, outs, strict=True)
    ]
    for c in children:
        c.start()
    for _ in children:
        ready.get(timeout=120)
    total = int(args.seconds * args.rate)
    interval = 1.0 / args.rate
    server_cpu = service_cpu(stack, db_url)
    clients_cpu = [psutil.Process(c.pid) for c in children]
    clients_before = sum(sum(p.cpu_times()[:2]) for p in clients_cpu)
    start = time.perf_counter()
    for step in range(1, total + 1):
        producer.record(step, loss=1.0 / step, loss_scale=65536.0, skipped_steps=0)
        delay = start + step * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    produced_for = time.perf_counter() - start
    server_cpu = service_cpu(stack, db_url) - server_cpu
    clients_after = sum(sum(p.cpu_times()[:2]) for p in clients_cpu)
    producer.finish(step=total)
    for c in children:
        c.join(600)  # a loaded machine may need minutes to deliver every record
    producer.close()
    results = [r for o in outs for r in json.loads(Path(o).read_text())]
    lat = np.array([x for r in results for x in r["lat"]]) * 1000
    lost = sum(len(set(range(1, total + 1)) - set(r["steps"])) for r in results)
    repeated = sum(len(r["steps"]) - len(set(r["steps"])) for r in results)
    return {
        "mode": mode,
        "watchers": watchers,
        "frames": sum(r["frames"] for r in results),
        "steps": total,
        "rate": total / produced_for,
        "messages": int(lat.size),
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "max_ms": float(lat.max()),
        "lost": lost,
        "repeated": repeated,
        "ended": sum(r["last"] == "end" for r in results),
        "server_cpu": server_cpu / produced_for,
        "clients_cpu": (clients_after - clients_before) / produced_for,
    }


def service_cpu(stack: Stack, db_url: str) -> float:
    """CPU seconds so far of what serves the watchers and records the points: the API's
    process tree, the redis-server, PostgreSQL (all of its processes) when it is the database."""
    redis_proc = stack.redis_server.process
    total = tree_cpu(stack.processes["api"].pid)
    total += tree_cpu(redis_proc.pid) if redis_proc is not None else 0.0
    return total + (postgres_cpu() if db_url.startswith("postgresql") else 0.0)


def throughput(stack: Stack, redis_url: str, db_url: str, args: Any) -> dict[str, Any]:
    job = stack.submit(SPEC)
    producer = Producer(redis_url, db_url, job["id"])
    producer.start()
    assert producer.sink is not None
    n, batch = args.records, args.publish_batch
    persisted_at: list[float] = []

    def poll() -> None:
        wait_until(lambda: stack.job(job["id"])["step"] >= n, 600, "persisted", interval=0.05)
        persisted_at.append(time.perf_counter())

    cpu = service_cpu(stack, db_url)
    start = time.perf_counter()
    poller = threading.Thread(target=poll)
    poller.start()
    for first in range(1, n + 1, batch):
        now = time.time()
        records = [
            metric(step=i, time=now, loss=1.0 / i, skipped_steps=0)
            for i in range(first, min(first + batch, n + 1))
        ]
        producer.sink.write(records)
    published = time.perf_counter() - start
    poller.join()
    cpu = service_cpu(stack, db_url) - cpu
    producer.finish(step=n)
    producer.close()
    return {
        "service_cpu_us_per_record": cpu / n * 1e6,
        "records": n,
        "batch": batch,
        "publish_per_s": n / published,
        "persist_per_s": n / (persisted_at[0] - start),
        "lag_after_publish_s": persisted_at[0] - start - published,
    }


def fan_out_line(r: dict[str, Any]) -> str:
    return (
        f"watchers={r['watchers']:4d} {r['mode']:6s} steps={r['steps']} at {r['rate']:.0f}/s: "
        f"p50 {r['p50_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms  max {r['max_ms']:.1f} ms  "
        f"messages {r['messages']} in {r['frames']} frames  lost {r['lost']}  "
        f"repeated {r['repeated']}  got end: {r['ended']}/{r['watchers']}  CPU cores busy: "
        f"API+Redis+database {r['server_cpu']:.2f}, clients {r['clients_cpu']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watchers", default="1,100,500")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument(
        "--publish-batch", type=int, default=200, help="records per publish (throughput)"
    )
    parser.add_argument(
        "--batch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run every watcher count with batch frames, side by side (default on)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="3 s per run, 5,000 records: a smoke run"
    )
    parser.add_argument(
        "--database", default="sqlite", help="sqlite, postgresql, or both: sqlite,postgresql"
    )
    parser.add_argument("--pg", default=os.environ.get("AMPTRAIN_TEST_DATABASE_URL"))
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.records = min(args.seconds, 3.0), min(args.records, 5_000)

    for database in args.database.split(","):
        if database == "sqlite":
            run_on(database, None, args)
        elif database == "postgresql":
            if not args.pg:
                parser.error("postgresql needs --pg URL (or AMPTRAIN_TEST_DATABASE_URL)")
            url, drop = throwaway_pg(args.pg)
            try:
                run_on(database, url, args)
            finally:
                drop()
        else:
            parser.error(f"--database: sqlite or postgresql, not {database[:40]!r}")


def run_on(database: str, db_url: str | None, args: Any) -> None:
    """Every run of the bench on one database (a SQLite file when ``db_url`` is None)."""
    root = Path(tempfile.mkdtemp(prefix="amp-bench-", dir="/tmp"))
    redis_server = EmbeddedRedis(root / "redis", appendonly=False).start()
    db_url = db_url or f"sqlite:///{root / 'amptrain.db'}"
    stack = Stack(root, db_url, redis_server)
    stack.env["AMPTRAIN_LOG_FORMAT"] = "text"
    modes = [False, True] if args.batch else [False]
    print(f"\n{database}:", flush=True)
    try:
        stack.start_api()
        for n in [int(x) for x in args.watchers.split(",") if x]:
            runs = [fan_out(stack, redis_server.url, db_url, n, args, batch) for batch in modes]
            for r in runs:
                print(fan_out_line(r), flush=True)
            if len(runs) == 2:
                single, batch = runs
                print(
                    f"watchers={n:4d} single/batch: p50 x{single['p50_ms'] / batch['p50_ms']:.1f}"
                    f"  p99 x{single['p99_ms'] / batch['p99_ms']:.1f}  frames "
                    f"x{single['frames'] / max(batch['frames'], 1):.1f}  API+Redis+database CPU "
                    f"{single['server_cpu']:.2f} vs {batch['server_cpu']:.2f} cores",
                    flush=True,
                )
        t = throughput(stack, redis_server.url, db_url, args)
        print(
            f"throughput: {t['records']} records in batches of {t['batch']}: publish "
            f"{t['publish_per_s']:.0f}/s, persisted {t['persist_per_s']:.0f}/s "
            f"(lag after the last publish {t['lag_after_publish_s']:.2f} s); API+Redis+database "
            f"CPU {t['service_cpu_us_per_record']:.0f} us per record",
            flush=True,
        )
    finally:
        stack.close()
        redis_server.stop()


if __name__ == "__main__":
    main()
