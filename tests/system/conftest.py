"""The service as the system tests run it: the API (with its recorder) and one Celery worker
against a private Redis and the test database. A module that needs another shape (two
workers, a data root, GPU queues) defines its own ``stack``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.support.stack import Stack


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.start_api()
    s.start_worker()
    yield s
    s.close()
