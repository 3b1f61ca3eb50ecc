"""Lifecycle events reach the job's stream through Redis outages and Redis data loss."""

from __future__ import annotations

from typing import Any

import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.stream import decode
from amptrain.core.redis import Keys
from amptrain.worker.pool.events import LifecycleEvents
from tests.support.redis_restart import restart

JOB = "j_" + "e" * 32


def told(client: redis.Redis) -> list[tuple[Any, ...]]:
    entries = [decode(f) for _, f in client.xrange(Keys.telemetry(JOB))]
    return [(e["kind"], e.get("type") or e.get("status"), e["attempt"]) for e in entries]


def test_an_event_told_while_redis_is_down_is_delivered_in_order(
    redis_server: EmbeddedRedis,
) -> None:
    events = LifecycleEvents(redis.Redis.from_url(redis_server.url, socket_timeout=2))
    redis_server.kill()
    events.publish(JOB, 1, "started", 0, {"worker": "w"})  # buffered, not raised
    client = restart(redis_server, lose_data=False)
    events.conclude(JOB, 1, "succeeded", 10, {}, end_status="succeeded")
    assert told(client) == [
        ("event", "started", 1),
        ("event", "succeeded", 1),
        ("end", "succeeded", 1),
    ]


def test_events_redis_lost_before_they_were_recorded_are_sent_again(
    redis_server: EmbeddedRedis,
) -> None:
    events = LifecycleEvents(redis.Redis.from_url(redis_server.url, socket_timeout=2))
    events.publish(JOB, 2, "started", 0, {"worker": "w"})
    client = redis.Redis.from_url(redis_server.url)
    first = client.xrange(Keys.telemetry(JOB))[0][0]
    client.set(Keys.recorded(JOB), first)  # the recorder has committed "started"
    events.publish(JOB, 2, "checkpoint", 5, {})  # ...and the writer has heard so
    client = restart(redis_server, lose_data=True)
    events.conclude(JOB, 2, "requeued", 7, {}, end_status=None)
    # "started" is in SQL already; the rest comes again, in order, and no end marker.
    assert told(client) == [("event", "checkpoint", 2), ("event", "requeued", 2)]
