"""What a person sees of a multi-node job in a real headless Chromium: the job page lists
the nodes of its newest multi-node attempt and their ranks (from its ``started`` event),
and the workers page says which slot holds a reservation. The records are written as the
workers write them (a ``started`` event in SQL, a slot in Redis), so no training runs."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

try:
    from playwright.sync_api import Page, expect
except ImportError:  # outside CI a missing playwright skips, like a missing browser
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

from amptrain.core import presence
from amptrain.store import jobs
from amptrain.store.db import make_engine, make_session_factory
from tests.server.web.dashboard.conftest import sign_in
from tests.support.shared_stack import running_stack
from tests.support.specs import mlp_job
from tests.support.stack import Stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API alone: nothing here trains."""
    with running_stack(tmp_path_factory.mktemp("nodes-view"), workers=()) as s:
        yield s


def test_the_job_page_lists_the_nodes_and_the_workers_page_the_reservation(
    page: Page, stack: Stack
) -> None:
    job = stack.submit(mlp_job(10, queue="gpu-a100", nodes=2, batch_size=64))
    nodes = [
        {
            "node": 0,
            "worker": "a@h1",
            "address": "10.0.0.1",
            "slot": 0,
            "ranks": [{"rank": 1, "pid": 11}],
        },
        {
            "node": 1,
            "worker": "b@h2",
            "address": "10.0.0.2",
            "slot": 0,
            "ranks": [{"rank": 0, "pid": 22}],
        },
    ]
    sessions = make_session_factory(make_engine(stack.env["AMPTRAIN_DATABASE_URL"]))
    with sessions.begin() as s:
        data = {"worker": "a@h1", "attempt": 2, "process": {"nodes": nodes, "world_size": 2}}
        jobs.insert_event(s, job["id"], 2, "started", 0, data)
    client = redis.Redis.from_url(stack.env["AMPTRAIN_REDIS_URL"])
    presence.publish_worker(client, "c@h3", {"queues": ["gpu-a100"], "concurrency": 1}, 60)
    slot = {"job_id": job["id"], "attempt": 3, "node": 0, "reservation": "waiting"}
    presence.publish_slot(client, "c@h3", 0, slot, 60)

    shown = stack.job(job["id"])
    assert shown["nodes_attempt"] == 2 and [n["worker"] for n in shown["nodes"]] == ["a@h1", "b@h2"]
    sign_in(page, stack.token)
    page.goto(f"/ui/#/jobs/{job['id']}")
    expect(page.locator("#nodes")).to_have_text(
        "attempt 2: node 0 a@h1 (10.0.0.1) rank 1 · node 1 b@h2 (10.0.0.2) rank 0"
    )
    page.goto("/ui/#/workers")
    expect(page.locator("body")).to_contain_text("node 0 reserved, waiting for the other nodes")
