"""The live hub against a real private Redis: every record reaches every watcher once and
in order, and a job with many batch watchers gets its records in paced rounds (fewer
socket writes per record), while a job with one watcher is never held back."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest
import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.records import metric
from amptrain.contract.stream import encode
from amptrain.core.redis import Keys
from amptrain.server.live.hub import PACE_MAX_S, PACE_PER_WATCHER_S, LiveHub, Subscription, gather_s

JOB = "j_" + uuid.uuid4().hex


def publish(url: str, steps: range, every_s: float) -> None:
    """Steps one XADD each, ``every_s`` apart (a worker at 1/every_s steps a second)."""
    client = redis.Redis.from_url(url)
    for step in steps:
        fields = encode(metric(step=step, time=0.0, loss=1.0), job_id=JOB, attempt=1)
        client.xadd(Keys.telemetry(JOB), fields)  # type: ignore[arg-type]
        time.sleep(every_s)
    client.close()


Seen = list[list[int]]
"""The steps of each round (hub delivery) a watcher got."""


async def follow(
    hub: LiveHub, grouped: int, plain: int, steps: range, url: str, every_s: float
) -> tuple[float, list[tuple[Subscription, Seen]]]:
    """Subscribe the watchers, publish ``steps`` from a thread, and collect the rounds each
    watcher got; with the seconds from the first publish to the last record taken."""
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        subs = [
            await stack.enter_async_context(hub.subscribe(JOB, grouped=i < grouped))
            for i in range(grouped + plain)
        ]
        seen: list[Seen] = [[] for _ in subs]

        async def drain(i: int, sub: Subscription) -> None:
            got = 0
            while got < len(steps):
                await sub.wait(5.0)
                batches = sub.take()
                assert batches, "a watcher waited 5 s for a record"
                for batch in batches:
                    seen[i].append([e.item["step"] for e in batch.entries])
                    got += len(batch.entries)

        drains = [asyncio.create_task(drain(i, s)) for i, s in enumerate(subs)]
        started = loop.time()
        await loop.run_in_executor(None, publish, url, steps, every_s)
        await asyncio.wait_for(asyncio.gather(*drains), 30)
    return loop.time() - started, list(zip(subs, seen, strict=True))


@pytest.fixture
def hub(redis_server: EmbeddedRedis) -> LiveHub:
    return LiveHub(redis_server.url)


def test_how_long_records_gather_grows_with_batch_watchers_up_to_a_bound() -> None:
    assert gather_s(0) == 0 and gather_s(1) == 0  # a lone watcher gets each record at once
    assert gather_s(200) == pytest.approx(200 * PACE_PER_WATCHER_S)
    assert gather_s(1000) == gather_s(100_000) == PACE_MAX_S


def test_many_batch_watchers_get_every_record_in_paced_rounds(
    hub: LiveHub, redis_server: EmbeddedRedis
) -> None:
    grouped, steps = 300, range(1, 201)  # 300 batch watchers: rounds >= 30 ms apart
    took, results = asyncio.run(_run(hub, grouped, 1, steps, redis_server.url))
    for _sub, seen in results:
        assert [step for round_ in seen for step in round_] == list(steps)  # all, once, in order
        # Unpaced, records 2 ms apart come about one per round; paced, rounds are at least
        # gather_s apart, however busy the machine (it only makes rounds rarer).
        assert len(seen) <= took / gather_s(grouped) + 1, (len(seen), took)


async def _run(
    hub: LiveHub, grouped: int, plain: int, steps: range, url: str, every_s: float = 0.002
) -> tuple[float, list[tuple[Subscription, Seen]]]:
    try:
        return await follow(hub, grouped, plain, steps, url, every_s)
    finally:
        await hub.close()
