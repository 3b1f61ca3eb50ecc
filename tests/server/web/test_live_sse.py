"""SSE GET /jobs/{id}/stream against a real uvicorn: same messages as the WebSocket,
resumed with Last-Event-ID."""

from __future__ import annotations

import httpx
import pytest

from tests.support.live import read_sse, steps_of
from tests.support.producer import Producer
from tests.support.specs import mlp_job
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def test_sse_resumes_with_last_event_id(stack: Stack, producer: Producer) -> None:
    producer.start()
    producer.steps(1, 50)
    first, last_id = read_sse(stack, producer.job_id, stop_at_step=30)
    assert steps_of(first) == list(range(1, 31)) and last_id == first[-1]["cursor"]
    producer.steps(51, 80)
    producer.evals(80, accuracy=0.9)
    producer.finish(step=80)
    rest, _ = read_sse(stack, producer.job_id, headers={"Last-Event-ID": str(last_id)})
    assert steps_of(rest) == list(range(31, 81))
    # An evaluation comes as its own event type with its cursor as id (read_sse checks it).
    (ev,) = [m for m in rest if m["type"] == "eval"]
    assert ev["data"]["step"] == 80 and ev["data"]["values"] == {"accuracy": 0.9}
    assert rest[-1]["type"] == "end" and rest[-1]["data"]["status"] == "succeeded"
    events = [m["data"]["type"] for m in first + rest if m["type"] == "event"]
    # No worker serves this stack's queues: the dispatcher's waiting_for_queue note may come.
    assert [e for e in events if e != "waiting_for_queue"] == ["queued", "started", "succeeded"]


def test_sse_needs_a_token_and_a_valid_cursor(stack: Stack) -> None:
    job = stack.submit(mlp_job(100, name="live", precision="fp32", batch_size=8))
    anonymous = httpx.get(f"http://127.0.0.1:{stack.port}/jobs/{job['id']}/stream")
    assert anonymous.status_code == 401
    bad = stack.client.get(f"/jobs/{job['id']}/stream", headers={"Last-Event-ID": "nope"})
    assert bad.status_code == 422
    assert stack.client.get("/jobs/j_missing/stream").status_code == 404
