"""Routing by job shape with real workers: a job waits (and says so) until a worker of its
queue comes; a ``--devices-per-job 2`` worker consumes the ``-x2`` queues and claims a
``devices: 2`` job; a one-device worker that gets a ``devices: 2`` job (sent to its queue
by the spec) fails it at once, for good, naming both numbers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.support.specs import mlp_job
from tests.support.stack import Stack, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.env["AMPTRAIN_WARM_SPARE"] = "false"  # routing is the point here: no spare to import
    s.env["AMPTRAIN_WORKER_METRICS_PORT"] = "0"
    s.start_api()
    yield s
    s.close()


def listed(stack: Stack, name: str) -> dict[str, Any] | None:
    items = stack.client.get("/workers").json()["items"]
    return next((w for w in items if w["name"] == name), None)


def events_of(stack: Stack, job_id: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in stack.events(job_id) if e["type"] == kind]


# Routing is not about the database (the event's SQL is tested on both in
# tests/server/test_routing.py): one run on SQLite keeps the suite short.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_jobs_reach_workers_of_their_shape(stack: Stack) -> None:
    # Nobody serves gpu-a100 yet: the job waits and says so, once.
    waiting = stack.submit(mlp_job(5, queue="gpu-a100", name="waits"))
    (said,) = wait_until(
        lambda: events_of(stack, waiting["id"], "waiting_for_queue"), 20, "waiting_for_queue"
    )
    assert said["data"]["queue"] == "gpu-a100"

    # A one-device worker of that queue comes: the job just runs. A devices: 2 job sent to
    # its queue by the spec fails at once without a retry, both numbers in the event.
    stack.start_worker("k1", "gpu-a100,cpu")
    wrong = stack.submit(mlp_job(5, devices=2, batch_size=64, queue="cpu", max_attempts=3))
    done = stack.wait_for_status(waiting["id"], "succeeded", "failed", timeout=120)
    assert done["status"] == "succeeded", done["error"]
    assert len(events_of(stack, waiting["id"], "waiting_for_queue")) == 1
    failed = stack.wait_for_status(wrong["id"], "failed", timeout=60)
    assert failed["error"]["code"] == "devices_mismatch" and failed["attempt"] == 1
    (mismatch,) = wait_until(  # recorded from the job's stream: soon, not at once
        lambda: events_of(stack, wrong["id"], "devices_mismatch"), 20, "the mismatch event"
    )
    assert mismatch["data"]["job_devices"] == 2 and mismatch["data"]["slot_devices"] == 1
    assert mismatch["data"]["worker"] == "k1@test"
    assert not events_of(stack, wrong["id"], "started")  # no training process was started

    # A two-device worker consumes the -x2 queues and shows each slot's GPUs.
    stack.start_worker("k2", "gpu,cpu", "--devices-per-job", "2")
    k2 = wait_until(lambda: listed(stack, "k2@test"), 30, "k2 in GET /workers")
    assert k2["queues"] == ["gpu-x2", "cpu-x2"] and k2["devices_per_job"] == 2
    assert k2["slots"] == [{"slot": 0, "gpus": []}]  # no GPU here: its ranks use the CPU
    k1 = listed(stack, "k1@test")
    assert k1 is not None and k1["devices_per_job"] == 1 and k1["queues"] == ["gpu-a100", "cpu"]

    pair = stack.submit(mlp_job(5, devices=2, batch_size=64))  # routed to cpu-x2
    # Only k2 consumes cpu-x2 (k1 would have failed it with devices_mismatch).
    wait_until(lambda: stack.job(pair["id"])["attempt"] >= 1, 60, "k2 to claim the job")
    assert not events_of(stack, pair["id"], "devices_mismatch")
    assert stack.client.post(f"/jobs/{pair['id']}/cancel").status_code in (202, 409)
