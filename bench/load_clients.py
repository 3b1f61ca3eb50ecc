"""The client side of ``bench/load.py``, each in its own process: the producers (the
jobs' telemetry through the worker's own sink), the WebSocket watchers, the pollers and
the probe that times ``GET /jobs`` and ``GET /jobs/{id}``. Each reports through a queue."""

from __future__ import annotations

import asyncio
import heapq
import json
import random
import time
from typing import Any

import numpy as np


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

    from amptrain.contract.records import metric
    from amptrain.worker.child.sink import RedisSink

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
) -> None:
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
                    response = client.get(path)
                    ok = response.status_code == 200 and (
                        route == "get" or len(response.json()["items"]) == min(20, len(job_ids))
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
