"""Shared fixtures: real Redis servers and real databases, private to the test run."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis

# One OpenMP thread per process, set before anything loads torch (its OpenMP runtime reads
# this once), inherited by every server, worker and training child a test starts. Four test
# processes share two cores with their own servers: torch's default of one thread per core
# has threads spin-waiting for each other across processes. Measured on this 2-core machine,
# tests/components/test_training.py and tests/engine/test_resume.py under -n 4: 170 s of CPU
# and 136 s of wall by default, 48 s and 44 s with one thread. Set it to override.
os.environ.setdefault("OMP_NUM_THREADS", "1")

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from tests.support.netns import Network
    from tests.support.stack import Stack


def _short_tmp() -> Path:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer.
    return Path(tempfile.mkdtemp(prefix="amp-", dir="/tmp"))


@pytest.fixture
def redis_server() -> Iterator[EmbeddedRedis]:
    """A private redis-server on a unix socket, fresh for each test."""
    server = EmbeddedRedis(_short_tmp()).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def session_redis() -> Iterator[EmbeddedRedis]:
    """One private redis-server for tests that only need *a* Redis (they use distinct keys)."""
    server = EmbeddedRedis(_short_tmp(), appendonly=False).start()
    yield server
    server.stop()


def _database_params() -> list[str]:
    params = ["sqlite"]
    if os.environ.get("AMPTRAIN_TEST_DATABASE_URL"):
        params.append("postgresql")
    return params


@pytest.fixture(params=_database_params())
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a SQLite file, and (when AMPTRAIN_TEST_DATABASE_URL is set) a
    throw-away PostgreSQL database created on that server for this one test."""
    from tests.support.databases import empty_database

    with empty_database(request.param, tmp_path) as url:
        yield url


@pytest.fixture(scope="module", params=_database_params())
def module_database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``database_url`` for a module's tests to share (with its stack: see
    tests/support/shared_stack.py); the tests still alternate between the databases."""
    from tests.support.databases import empty_database

    with empty_database(request.param, tmp_path_factory.mktemp("db")) as url:
        yield url


@pytest.fixture
def sf(database_url: str) -> Iterator[sessionmaker[Session]]:
    """A session factory on ``database_url`` migrated to head (the engine is disposed after)."""
    from amptrain.store.db import make_engine, make_session_factory
    from tests.support.databases import migrated

    migrated(database_url)
    engine = make_engine(database_url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def api_stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    """The API alone (uvicorn in a subprocess, no worker): jobs stay queued unless a test
    moves them or starts a worker itself."""
    from tests.support.stack import Stack

    stack = Stack(tmp_path, database_url, redis_server)
    stack.start_api()
    yield stack
    stack.close()


@pytest.fixture
def netns_hosts() -> Iterator[Callable[[int], Network]]:
    """``netns_hosts(n)``: ``n`` hosts as network namespaces on a bridge, each its own
    address (tests/support/netns.py); all cleaned up after the test, pass or fail. Skips
    where namespaces cannot be made (not root), except under ``CI``, which runs as root."""
    from tests.support.netns import netns_unavailable, networks

    if reason := netns_unavailable():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the multi-host tests: {reason}")
        pytest.skip(reason)
    with networks() as make:
        yield make


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _skip_gpu_tests_without_cuda(items)
    _one_database_per_end_to_end_test(config, items)
    items[:] = _long_tests_first_in_every_process(items)


def _long_tests_first_in_every_process(items: list[pytest.Item]) -> list[pytest.Item]:
    """The long tests (``slow`` or ``heavy``) start the run in every test process, not just
    the first: xdist's worksteal hands each process a contiguous slice of this order (the
    first quarter to the first process, and so on) and an idle process steals the tail of
    the longest queue. With the long tests merely sorted first they all sat in the first
    process's slice, and the others stole them late: minute-long tests ran alone in the
    run's last minutes. Here every slice starts with its share of them (dealt in turn, in
    their sorted order; the tests that share a module's stack as one), and every tail holds
    short tests to steal."""
    from tests.support.shared_stack import share_key

    long = [i for i in items if i.get_closest_marker("slow") or i.get_closest_marker("heavy")]
    short = [
        i for i in items if not (i.get_closest_marker("slow") or i.get_closest_marker("heavy"))
    ]
    # The long tests that share a stack go to one process together, one after the other
    # (dealt apart, every process would start that stack again).
    units: dict[object, list[pytest.Item]] = {}
    for item in long:
        units.setdefault(share_key(item) or item, []).append(item)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    # The slice sizes worksteal.check_schedule sends: what is left over the processes left.
    sizes, left = [], len(items)
    for remaining in range(workers, 0, -1):
        sizes.append(left // remaining)
        left -= sizes[-1]
    heads: list[list[pytest.Item]] = [[] for _ in sizes]
    for unit in units.values():  # each to the process with the fewest so far: in turn for singles
        min(heads, key=len).extend(unit)
    ordered: list[pytest.Item] = []
    for size, head in zip(sizes, heads, strict=True):
        ordered += head + short[: max(0, size - len(head))]
        del short[: max(0, size - len(head))]
    return ordered + short


def _skip_gpu_tests_without_cuda(items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` skip cleanly where there is no CUDA device (CI never has one)."""
    if any(item.get_closest_marker("gpu") for item in items) and not cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


def _one_database_per_end_to_end_test(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An end-to-end test (marked ``slow``, or on a stack) runs against one database,
    not each: with PostgreSQL configured, a module's end-to-end tests alternate between
    SQLite and PostgreSQL in the order they are written (not the order they run in, which
    pytest-randomly shuffles), so both backends run the service end to end while each
    test's processes start once. Every statement of the store runs on both backends in the
    store's and the services' own tests."""
    databases = _database_params()
    if len(databases) < 2:
        return
    where: dict[tuple[str, ...], tuple[str, int]] = {}
    backends: dict[tuple[str, ...], set[str | None]] = {}
    for item in items:
        variant = _end_to_end_variant(item)
        if variant is not None:
            path, line, _ = item.location
            where[variant] = min(where.get(variant, (path, line or 0)), (path, line or 0))
            backends.setdefault(variant, set()).add(_database_of(item))
    # A test that already chose its one database (the fuzzer's) keeps it.
    where = {v: w for v, w in where.items() if len(backends[v]) > 1}
    index = {v: i for i, v in enumerate(sorted(where, key=lambda v: (where[v], v)))}
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        variant = _end_to_end_variant(item)
        if variant not in index:
            keep.append(item)
            continue
        chosen = databases[index[variant] % len(databases)]
        (keep if _database_of(item) == chosen else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


DATABASE_FIXTURES = ("database_url", "module_database_url")
"""The parametrised database fixtures: one test's, and one a module's tests share."""


def _database_of(item: pytest.Item) -> str | None:
    """The database ("sqlite", "postgresql") an item runs on, None when it has none."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return next((str(params[f]) for f in DATABASE_FIXTURES if f in params), None)


STACK_FIXTURES = frozenset({"api_stack", "stack", "module_stack"})
"""The fixtures that start the service's processes for a test (tests/support/stack.py)."""


def _end_to_end_variant(item: pytest.Item) -> tuple[str, ...] | None:
    """An end-to-end test's identity without its database (None for other tests): a test
    marked ``slow``, or one on ``api_stack`` or a module's ``stack`` (a real uvicorn: its
    start, not the test's requests, is most of such a test's cost, and its SQL runs on both
    backends in the store's tests)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    stacks = STACK_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    end_to_end = item.get_closest_marker("slow") or stacks
    if not end_to_end or _database_of(item) is None:
        return None
    return (
        item.path.name,
        item.originalname,  # type: ignore[attr-defined]
        *(str(v) for k, v in sorted(params.items()) if k not in DATABASE_FIXTURES),
    )
