"""SSE GET /jobs/{id}/stream against a real uvicorn: same messages as the WebSocket,
resumed with Last-Event-ID."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.support.producer import Producer
from tests.support.specs import mlp_job
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.env["AMPTRAIN_LIVE_HEARTBEAT_SECONDS"] = "0.5"
    s.start_api()
    yield s
    s.close()


def read_sse(
    stack: Stack,
    job_id: str,
    stop_at_step: int | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """(messages, last ``id:`` seen) until the stream ends or ``stop_at_step`` arrives."""
    got: list[dict[str, Any]] = []
    last_id = None
    frame: dict[str, str] = {}
    with stack.client.stream("GET", f"/jobs/{job_id}/stream", headers=headers) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line:
                name, _, value = line.partition(": ")
                frame[name] = value
                continue
            msg = json.loads(frame["data"])
            assert msg["type"] == frame["event"]
            if "id" in frame:
                assert frame["id"] == msg["cursor"]
                last_id = frame["id"]
            got.append(msg)
            frame = {}
            if stop_at_step and msg["type"] == "metric" and msg["data"]["step"] == stop_at_step:
                break
    return got, last_id


def steps(messages: list[dict[str, Any]]) -> list[int]:
    return [m["data"]["step"] for m in messages if m["type"] == "metric"]


def test_sse_resumes_with_last_event_id(
    stack: Stack, database_url: str, redis_server: EmbeddedRedis
) -> None:
    job = stack.submit(mlp_job(100, name="live", precision="fp32", batch_size=8))
    producer = Producer(redis_server.url, database_url, job["id"])
    try:
        producer.start()
        producer.steps(1, 50)
        first, last_id = read_sse(stack, job["id"], stop_at_step=30)
        assert steps(first) == list(range(1, 31)) and last_id == first[-1]["cursor"]
        producer.steps(51, 80)
        producer.finish(step=80)
        rest, _ = read_sse(stack, job["id"], headers={"Last-Event-ID": str(last_id)})
    finally:
        producer.close()
    assert steps(rest) == list(range(31, 81))
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
