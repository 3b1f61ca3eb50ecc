"""What the recorder tests share: a Redis client on the test's server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from amptrain.cli.embedded_redis import EmbeddedRedis


@pytest.fixture
def r(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=10)
    yield client
    client.close()
