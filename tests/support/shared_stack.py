"""One stack for a test module's tests: started once, not once per test.

Starting a stack (uvicorn, a Celery worker importing torch, a private Redis, a migrated
database) costs 4-6 s of wall on a quiet two-core machine and 45-85 s in a loaded suite run,
more than most end-to-end tests spend on their own requests. Tests that share one stay
isolated by what they create: their own job ids, or their own user (``user_client``) where
they list what they see. A test that kills a process of the shared stack restarts it before
it ends (:func:`restarted`, ``Stack.start_api``); one that changes the stack's settings
keeps a stack of its own.

A module shares with ``module_stack`` (or its own module-scoped fixture on
``module_database_url``). Its tests still alternate between SQLite and PostgreSQL
(tests/conftest.py), so a module runs one stack per database, and the test processes
receive each such group whole (:func:`share_key`), so that one process starts it once.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.support.stack import Stack

MODULE_DATABASE = "module_database_url"
"""The module-scoped database fixture (tests/conftest.py): its users share a stack."""


@contextmanager
def running_stack(
    root: Path,
    database_url: str | None = None,
    *,
    workers: tuple[str, ...] = ("worker",),
    env: Mapping[str, str] | None = None,
) -> Iterator[Stack]:
    """A stack in ``root`` with its own private Redis: the API and one Celery worker per name
    in ``workers`` (queues gpu and cpu), on ``database_url`` (default: SQLite in ``root``);
    ``env`` is added to its environment."""
    redis_server = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="amp-", dir="/tmp"))).start()
    s = Stack(root, database_url or f"sqlite:///{root / 'amptrain.db'}", redis_server)
    s.env.update(env or {})
    try:
        s.start_api()
        for name in workers:
            s.start_worker(name)
        yield s
    finally:
        s.close()
        redis_server.stop()


@contextmanager
def restarted(stack: Stack, worker: str) -> Iterator[None]:
    """Start ``worker`` again at the end if the block stopped it, passed or failed: the
    tests that share the stack after this one need it."""
    try:
        yield
    finally:
        if stack.processes[worker].poll() is not None:
            stack.start_worker(worker)


def log_since(stack: Stack, name: str, offset: int) -> str:
    """What process ``name`` logged after byte ``offset`` (a test's own part of a shared log)."""
    with open(stack.root / f"{name}.log", "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def log_size(stack: Stack, name: str) -> int:
    """The current length of process ``name``'s log: pass it to :func:`log_since` later."""
    return (stack.root / f"{name}.log").stat().st_size


def share_key(item: pytest.Item) -> tuple[str, str] | None:
    """The stack ``item`` shares with others (its module and database), or None: the test
    processes receive the items of one key together, in one run of the queue."""
    if MODULE_DATABASE not in getattr(item, "fixturenames", ()):
        return None
    params = getattr(getattr(item, "callspec", None), "params", {})
    return (str(item.path), str(params.get(MODULE_DATABASE)))
