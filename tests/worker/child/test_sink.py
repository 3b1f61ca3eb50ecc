"""The worker's Redis sink keeps every record through Redis outages and data loss."""

from __future__ import annotations

import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.records import metric
from amptrain.contract.stream import decode
from amptrain.core.redis import Keys
from amptrain.worker.child.sink import RedisSink
from tests.support.redis_restart import restart

J1 = "j_" + "1" * 32  # a job id as the API generates them (Keys accepts no other)


def records(first: int, last: int) -> list[dict]:
    return [metric(step=s, loss=1.0 / s, skipped=False) for s in range(first, last + 1)]


def steps_in_stream(client: redis.Redis, job_id: str) -> list[int]:
    return [decode(f)["step"] for _, f in client.xrange(Keys.telemetry(job_id))]


def test_records_arrive_in_order_and_decode(redis_server: EmbeddedRedis) -> None:
    sink = RedisSink.from_url(redis_server.url, J1, attempt=2)
    sink.write(records(1, 5))
    sink.write(records(6, 8))
    client = redis.Redis.from_url(redis_server.url)
    entries = [decode(f) for _, f in client.xrange(Keys.telemetry(J1))]
    assert [e["step"] for e in entries] == list(range(1, 9))
    assert {e["attempt"] for e in entries} == {2}
    assert (
        entries[3]["loss"] == 0.25
        and entries[3]["skipped"] is False
        and entries[3]["grad_norm"] is None
    )


def test_outage_buffers_and_delivers_everything_once_redis_is_back(
    redis_server: EmbeddedRedis,
) -> None:
    sink = RedisSink.from_url(redis_server.url, J1, attempt=1)
    sink.write(records(1, 10))
    redis_server.kill()
    sink.write(records(11, 20))  # must not raise: the training thread's publisher keeps going
    assert not sink.flush()
    client = restart(redis_server, lose_data=False)
    sink.close(timeout=10)
    assert sorted(set(steps_in_stream(client, J1))) == list(range(1, 21))


def test_redis_that_lost_its_data_gets_unrecorded_records_again(
    redis_server: EmbeddedRedis,
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    sink = RedisSink.from_url(redis_server.url, J1, attempt=1)
    sink.write(records(1, 10))
    # The recorder committed up to step 6 and said so.
    sixth = client.xrange(Keys.telemetry(J1))[5][0]
    client.set(Keys.recorded(J1), sixth)
    sink.write(records(11, 12))
    assert [s for s in (decode(f)["step"] for _, f in sink.retained)] == list(range(7, 13))

    client = restart(redis_server, lose_data=True)
    sink.write(records(13, 15))
    sink.close(timeout=10)
    # Steps 1-6 are in SQL already; everything after them is in the new stream, in order.
    assert steps_in_stream(client, J1) == list(range(7, 16))
