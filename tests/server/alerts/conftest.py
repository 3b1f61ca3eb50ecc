"""An API (with its recorder and webhook sender) set up for webhooks on loopback: fast
polls and backoff, short timeouts; jobs are driven by a :class:`Producer`, no worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.support.producer import Producer
from tests.support.receiver import Receiver
from tests.support.specs import mlp_job
from tests.support.stack import Stack

WEBHOOK_ENV = {
    "AMPTRAIN_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1,localhost",
    "AMPTRAIN_WEBHOOK_ALLOW_PRIVATE": "true",
    "AMPTRAIN_WEBHOOK_TIMEOUT_SECONDS": "2",
    "AMPTRAIN_WEBHOOK_BACKOFF_SECONDS": "0.2",
    "AMPTRAIN_WEBHOOK_BACKOFF_MAX_SECONDS": "0.5",
    "AMPTRAIN_WEBHOOK_POLL_SECONDS": "0.1",
    "AMPTRAIN_WEBHOOK_CONCURRENCY": "4",
    "AMPTRAIN_MAX_ALERT_RULES_PER_USER": "4",
    "AMPTRAIN_ALERT_STALL_POLL_SECONDS": "0.5",
}


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.env.update(WEBHOOK_ENV)
    s.start_api()
    yield s
    s.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def started_job(stack: Stack, client: httpx.Client, name: str = "tiny") -> Producer:
    """A job of ``client``'s user, claimed by a producer that plays its worker."""
    r = client.post("/jobs", json=mlp_job(100, name=name, precision="fp32"))
    assert r.status_code == 201, r.text
    p = Producer(stack.redis_server.url, stack.env["AMPTRAIN_DATABASE_URL"], r.json()["id"])
    p.start()
    return p
