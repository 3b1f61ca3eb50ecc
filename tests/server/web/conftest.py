"""The stack the live-endpoint tests (WS and batch frames) share: a real API with a 0.5 s
heartbeat and 512-message watcher queues, and a producer of one queued job's telemetry.
A module that needs other settings defines its own ``stack``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.support.producer import Producer
from tests.support.specs import mlp_job
from tests.support.stack import Stack


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.env["AMPTRAIN_LIVE_HEARTBEAT_SECONDS"] = "0.5"
    s.env["AMPTRAIN_LIVE_QUEUE_SIZE"] = "512"
    s.start_api()
    yield s
    s.close()


@pytest.fixture
def producer(stack: Stack, database_url: str, redis_server: EmbeddedRedis) -> Iterator[Producer]:
    """A queued 100-step job (no worker serves it) whose telemetry the test writes."""
    job = stack.submit(mlp_job(100, name="live", precision="fp32", batch_size=8))
    p = Producer(redis_server.url, database_url, job["id"])
    yield p
    p.close()
