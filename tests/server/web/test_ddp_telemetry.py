"""A data-parallel run's ``world_size`` and ``memory_peak_per_rank`` reach clients: the
metric pages of GET /jobs/{id}/metrics and the SSE stream of the finished job (served
from SQL), against a real API. Messages built from live stream entries are checked in
tests/server/recorder/test_parallel.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.records import metric
from tests.support.producer import Producer
from tests.support.specs import mlp_job
from tests.support.stack import Stack, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.start_api()
    yield s
    s.close()


def live_metrics(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    """The metric messages of a finished job's SSE stream, until its ``end``."""
    out = []
    with stack.client.stream("GET", f"/jobs/{job_id}/stream") as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                msg = json.loads(line.removeprefix("data: "))
                if msg["type"] == "end":
                    return out
                if msg["type"] == "metric":
                    out.append(msg["data"])
    return out


def test_parallel_fields_reach_history_and_live_watchers(
    stack: Stack, database_url: str, redis_server: EmbeddedRedis
) -> None:
    job = stack.submit(mlp_job(4, devices=2, batch_size=64))
    producer = Producer(redis_server.url, database_url, job["id"])
    try:
        producer.start()
        assert producer.sink is not None
        producer.sink.write(
            [
                metric(
                    step=s,
                    loss=1.0,
                    memory_peak=200 + s,
                    world_size=2,
                    memory_peak_per_rank=[100 + s, 200 + s],
                )
                for s in range(1, 5)
            ]
        )
        assert producer.sink.flush()
        producer.finish(step=4)
    finally:
        producer.close()
    items = wait_until(
        lambda: (page := stack.all_metrics(job["id"])) and len(page) == 4 and page,
        20,
        "four recorded points",
    )
    live = live_metrics(stack, job["id"])
    for points in (items, live):
        assert [p["world_size"] for p in points] == [2, 2, 2, 2]
        assert [p["memory_peak_per_rank"] for p in points] == [
            [100 + s, 200 + s] for s in range(1, 5)
        ]
    # A one-device run: the same fields, null.
    single = stack.submit(mlp_job(2))
    producer = Producer(redis_server.url, database_url, single["id"])
    try:
        producer.start()
        producer.steps(1, 2)
        producer.finish(step=2)
    finally:
        producer.close()
    plain = wait_until(lambda: stack.all_metrics(single["id"]), 20, "recorded points")
    assert plain[0]["world_size"] is None and plain[0]["memory_peak_per_rank"] is None
