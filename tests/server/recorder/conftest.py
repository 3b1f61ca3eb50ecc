"""What the recorder tests share: a Redis client on the test's server, and the PostgreSQL
insert path under test."""

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


@pytest.fixture(params=["copy", "values"])
def method(request: pytest.FixtureRequest, database_url: str) -> str:
    """The PostgreSQL insert path under test (SQLite has one path: it runs once)."""
    if database_url.startswith("sqlite") and request.param != "copy":
        pytest.skip("SQLite has one insert path")
    return str(request.param)
