"""What a job's owner sees of its events: no worker host names or process ids (an admin
still gets them from GET /jobs/{id}/events), and checkpoints by name and step, never by
the server's path. Against a real API; the job's events come the way a worker writes them
(``tests.support.producer``: the supervisor's lifecycle events, the engine's records)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.layout import checkpoint_name
from tests.support.live import watch
from tests.support.producer import Producer
from tests.support.specs import mlp_job
from tests.support.stack import Stack, user_client, wait_until

pytestmark = pytest.mark.slow

STARTED = {
    "worker": "amptrain-4242@gpu-node-17",
    "attempt": 1,
    "precision": {"effective": "fp32"},
    "process": {
        "pid": 5151,
        "warm": False,
        "launcher_pid": 5150,
        "devices": 2,
        "ranks": [{"rank": 0, "pid": 5152}, {"rank": 1, "pid": 5153}],
        "rendezvous_port": 29517,
    },
}


def by_type(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["type"]: e for e in events}


def test_owners_see_no_host_detail_admins_do(
    stack: Stack, database_url: str, redis_server: EmbeddedRedis
) -> None:
    with user_client(stack, "alice") as alice:
        job = alice.post("/jobs", json=mlp_job(5)).json()["id"]
        token = alice.headers["Authorization"].removeprefix("Bearer ")
        producer = Producer(redis_server.url, database_url, job)
        try:
            producer.start()
            producer.events.publish(job, producer.attempt, "started", 0, STARTED)
            producer.steps(1, 5)
            producer.engine_event("checkpoint", 5, name=checkpoint_name(5))
            producer.finish(step=5)
        finally:
            producer.close()
        wait_until(lambda: stack.job(job)["status"] == "succeeded", 30, "the job to finish")
        wait_until(
            lambda: "succeeded" in by_type(alice.get(f"/jobs/{job}/events").json()["items"]),
            30,
            "its events to be recorded",
        )
        mine = [e for e in alice.get(f"/jobs/{job}/events").json()["items"] if e["data"]]
        live, _ = asyncio.run(watch(stack, job, token=token))
    started = [e for e in mine if e["type"] == "started" and "process" in e["data"]]
    (seen,) = started
    assert seen["data"] == {
        "attempt": 1,
        "precision": {"effective": "fp32"},
        "process": {"warm": False, "devices": 2, "ranks": [{"rank": 0}, {"rank": 1}]},
    }
    assert by_type(mine)["checkpoint"]["data"] == {"name": "step-000000005.pt"}
    assert by_type(mine)["checkpoint"]["step"] == 5
    live_events = [m["data"] for m in live if m["type"] == "event"]
    text = repr(live_events)
    assert "gpu-node-17" not in text and "5151" not in text and "29517" not in text
    assert any(e["type"] == "started" and "process" in e["data"] for e in live_events)
    # The admin's view keeps where the job ran.
    admin = [e for e in stack.events(job) if e["type"] == "started" and "process" in e["data"]]
    assert admin[0]["data"] == STARTED
