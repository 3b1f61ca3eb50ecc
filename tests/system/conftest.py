"""The service as the system tests run it: the API (with its recorder) and one Celery worker
against a private Redis and the test database, for one test (``stack``) or for a module's
tests to share (``module_stack``: tests/support/shared_stack.py). A module that needs another
shape (two workers, a data root, GPU queues) defines its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.support.shared_stack import running_stack
from tests.support.stack import Stack


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.start_api()
    s.start_worker()
    yield s
    s.close()


@pytest.fixture(scope="module")
def module_stack(
    module_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The same service, started once for the module's tests on one database."""
    with running_stack(tmp_path_factory.mktemp("stack"), module_database_url) as s:
        yield s
