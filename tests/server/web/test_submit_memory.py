"""Memory admission at submit, against a real API, Redis and database: a spec whose dataset
(and, on a CPU, model) cannot fit the memory the live workers of its queue report is a 422
naming both numbers. The worker here is its presence in Redis, written the way
``amptrain worker`` writes it (``amptrain.core.presence``), so the API reads the real thing.
"""

from __future__ import annotations

from typing import Any

import redis

from amptrain.core import presence
from tests.support.specs import mlp_job
from tests.support.stack import Stack

GiB = 2**30
# The probe: 185 GiB of synthetic data (features 16384, a million samples), 208 GiB
# with its held-out eighth.
HUGE = {
    "name": "synthetic-classification",
    "args": {"features": 16384, "num_samples": 1_000_000},
}


def announce(stack: Stack, name: str, *, available: float, queues: list[str], gpu: bool) -> None:
    devices: list[dict[str, Any]] = [{"type": "cpu", "memory_bytes": int(23.5 * GiB)}]
    if gpu:
        devices.insert(0, {"type": "cuda", "index": 0, "memory_bytes": 80 * GiB})
    info = {
        "queues": queues,
        "concurrency": 1,
        "devices": devices,
        "memory_available_bytes": int(available * GiB),
        "memory_total_bytes": int(23.5 * GiB),
    }
    with redis.Redis.from_url(stack.env["AMPTRAIN_REDIS_URL"]) as client:
        presence.publish_worker(client, name, info, ttl_s=600)


def test_a_dataset_larger_than_every_worker_is_refused_at_submit(api_stack: Stack) -> None:
    stack = api_stack
    # No worker has said anything yet: the API cannot know, the worker will check.
    assert stack.client.post("/jobs", json=mlp_job(dataset=HUGE)).status_code == 201
    announce(stack, "w1@test", available=20.4, queues=["gpu", "cpu"], gpu=False)
    r = stack.client.post("/jobs", json=mlp_job(dataset=HUGE))
    assert r.status_code == 422, r.text
    (problem,) = r.json()["detail"]
    assert problem["field"] == "dataset.args" and problem["type"] == "too_large"
    assert "the job needs about 208." in problem["message"]
    assert "at most 20.4 GiB available to a training process" in problem["message"]
    assert stack.client.post("/jobs", json=mlp_job()).status_code == 201  # small ones pass


def test_the_model_counts_where_it_lives_and_every_process_holds_the_dataset(
    api_stack: Stack,
) -> None:
    stack = api_stack
    announce(stack, "gpu@test", available=8, queues=["gpu", "gpu-x2"], gpu=True)
    announce(stack, "cpu@test", available=8, queues=["cpu"], gpu=False)
    big_model = {"name": "mlp", "args": {"width": 16384, "depth": 4}}  # ~13 GiB of state
    data = {"name": "synthetic-classification", "args": {"features": 1024, "num_samples": 600_000}}
    # On the GPU worker the model is not in host memory: its 7 GiB of data fit 8 GiB.
    assert (
        stack.client.post("/jobs", json=mlp_job(model=big_model, device="auto")).status_code == 201
    )
    r = stack.client.post("/jobs", json=mlp_job(model=big_model))  # device cpu: queue cpu
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "model.args", r.text
    ok = mlp_job(dataset=data, device="auto")
    assert stack.client.post("/jobs", json=ok).status_code == 201, "one copy: ~7 GiB"
    twice = {**ok, "devices": 2, "batch_size": 64}
    r = stack.client.post("/jobs", json=twice)  # two processes, two copies
    assert r.status_code == 422, r.text
    assert "(2 processes)" in r.json()["detail"][0]["message"]
