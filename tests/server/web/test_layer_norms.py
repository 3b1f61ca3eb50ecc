"""Per-layer gradient norms through the service: the worker's sink -> Redis -> recorder ->
their chunks (kind ``layer_grad_norm``) -> ``GET /jobs/{id}/layer-norms`` and the live
stream, beside evaluations that read exactly as before. Real uvicorn, Redis, database."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from amptrain.contract.records import layer_norms
from tests.server.web.test_http import fields
from tests.support.live import last_cursor, watch
from tests.support.producer import Producer
from tests.support.stack import Stack, wait_until

pytestmark = pytest.mark.slow


def norms(step: int) -> dict[str, float | None]:
    # "accuracy" is also an eval metric's name: the kinds keep the two series apart.
    return {"net.1": 1.0 / step, "net.5": 2.0 * step, "accuracy": 0.5, "head": None}


def publish_norms(producer: Producer, *steps: int) -> None:
    assert producer.sink is not None
    producer.sink.write([layer_norms(s, 1000.0 + s, norms(s)) for s in steps])


def layer_page(stack: Stack, job_id: str, **params: Any) -> dict[str, Any]:
    response = stack.client.get(f"/jobs/{job_id}/layer-norms", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_layer_norms_are_read_paged_downsampled_and_streamed_beside_unchanged_evals(
    stack: Stack, producer: Producer
) -> None:
    job_id = producer.job_id
    producer.start()
    for first in range(1, 60, 10):  # steps 1..60; norms every 5 steps, evals every 10
        producer.steps(first, first + 9)
        publish_norms(producer, first + 4, first + 9)
        producer.evals(first + 9)
    wait_until(lambda: len(layer_page(stack, job_id)["items"]) == 12, 30, "12 layer records")

    page = layer_page(stack, job_id)
    assert [i["step"] for i in page["items"]] == list(range(5, 61, 5))
    assert page["items"][1]["values"] == norms(10)
    assert page["next_cursor"] == page["items"][-1]["cursor"]
    # One step a page, by the cursor.
    one = layer_page(stack, job_id, limit=1)
    two = layer_page(stack, job_id, limit=1, after=one["next_cursor"])
    assert [i["step"] for i in one["items"] + two["items"]] == [5, 10]
    # Downsampled: each bucket's first and last step and its highest norm survive.
    window = layer_page(stack, job_id, max_points=4)
    assert 0 < len(window["items"]) <= 4 and all(i["downsampled"] for i in window["items"])
    assert window["items"][-1]["step"] == 60  # the highest norm (net.5 = 120) is there
    whole = layer_page(stack, job_id, max_points=100)
    assert [i["step"] for i in whole["items"]] == list(range(5, 61, 5))
    bad = stack.client.get(f"/jobs/{job_id}/layer-norms", params={"max_points": 0, "limit": 0})
    assert fields(bad) == {"query.max_points", "query.limit"}

    # The evaluations read as before: their own series, summary and window.
    evals = stack.client.get(f"/jobs/{job_id}/evals").json()["items"]
    assert [e["step"] for e in evals] == [10, 20, 30, 40, 50, 60]
    assert all(set(e["values"]) == {"eval_loss", "accuracy"} for e in evals)
    assert evals[0]["values"]["accuracy"] == pytest.approx(0.9)
    summary = stack.job(job_id)["summary"]["eval"]
    assert summary["step"] == 60 and set(summary["values"]) == {"eval_loss", "accuracy"}
    eval_window = stack.client.get(f"/jobs/{job_id}/evals", params={"max_points": 100}).json()
    assert [e["step"] for e in eval_window["items"]] == [10, 20, 30, 40, 50, 60]
    assert eval_window["next_cursor"] == evals[-1]["cursor"]

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        first, _ = await watch(
            stack, job_id, until=lambda m: m["type"] == "metric" and m["data"]["step"] == 60
        )
        producer.steps(61, 70)
        publish_norms(producer, 65, 70)  # live, possibly before the recorder has them
        producer.finish(step=70)
        second, _ = await watch(stack, job_id, after=last_cursor(first))
        return first, second

    first, second = asyncio.run(scenario())
    streamed = [m for m in first + second if m["type"] == "layer_grad_norm"]
    assert [m["data"]["step"] for m in streamed] == list(range(5, 71, 5))
    assert [m["data"]["step"] for m in second if m["type"] == "layer_grad_norm"][-2:] == [65, 70]
    assert streamed[0]["data"]["values"] == norms(5)
    recorded = wait_until(
        lambda: (p := layer_page(stack, job_id))["items"][-1]["step"] == 70 and p, 30, "step 70"
    )
    # The cursor GET /layer-norms gives each is the one the stream carried.
    assert [(m["cursor"], m["data"]["values"]) for m in streamed] == [
        (i["cursor"], i["values"]) for i in recorded["items"]
    ]
    assert [m["data"]["step"] for m in first + second if m["type"] == "eval"] == [
        10,
        20,
        30,
        40,
        50,
        60,
    ]
