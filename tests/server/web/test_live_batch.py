"""Batch frames (``?batch=true``) on WS /jobs/{id}/ws and SSE /jobs/{id}/stream against a
real uvicorn, Redis and database: every record exactly once, in order, across a
reconnect with the last batch's cursor; a client without the opt-in still gets one
message per record; a stalled batch watcher is cut off while the others stay complete."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.live import read_sse, records, stall_one_of_three, steps_of, watch
from tests.support.producer import Producer
from tests.support.stack import Stack, wait_until

pytestmark = pytest.mark.slow

Message = dict[str, Any]
BATCH_MAX_ITEMS = 500  # the documented bound of one frame


def assert_batch_frames(frames: list[Message]) -> None:
    """Records only inside batches; each batch bounded, its cursor its last item's."""
    for frame in frames:
        assert frame["type"] in ("batch", "heartbeat", "end", "gap"), frame
        if frame["type"] == "batch":
            assert 1 <= len(frame["items"]) <= BATCH_MAX_ITEMS
            assert frame["cursor"] == frame["items"][-1]["cursor"]
            assert {m["type"] for m in frame["items"]} <= {"metric", "event"}


def sequence(messages: list[Message]) -> list[tuple[str, str]]:
    return [(m["type"], m["cursor"]) for m in records(messages) if m["type"] != "heartbeat"]


def test_batch_frames_carry_every_record_once_across_a_reconnect(
    stack: Stack, producer: Producer
) -> None:
    job_id = producer.job_id
    producer.start()
    producer.steps(1, 700)  # history longer than one frame holds
    wait_until(lambda: int(stack.job(job_id)["step"]) == 700, 30, "steps 1-700 in SQL")

    def past(step: int) -> Any:
        return lambda m: m["type"] == "batch" and steps_of([m])[-1:] >= [step]

    async def feed() -> None:
        for start in range(701, 741, 5):
            await asyncio.sleep(0.1)
            producer.steps(start, start + 4)

    async def scenario() -> tuple[list[Message], list[Message], list[Message], int | None]:
        single = asyncio.create_task(watch(stack, job_id))  # an old client, throughout
        # Steps 701-740 arrive live while the first batch watcher reads; it stops at a
        # frame past step 720, and 741-760 come while no batch watcher is connected.
        feeding = asyncio.create_task(feed())
        first, code = await watch(stack, job_id, batch=True, until=past(720))
        assert code is None
        await feeding
        producer.steps(741, 760)  # while nobody watches in batches

        async def more_later() -> None:
            for start in range(761, 1000, 40):
                await asyncio.sleep(0.05)
                producer.steps(start, start + 39)
            producer.finish(step=1000)

        task = asyncio.create_task(more_later())
        second, code = await watch(stack, job_id, batch=True, after=first[-1]["cursor"])
        await task
        plain, _ = await single
        return first, second, plain, code

    first, second, plain, code = asyncio.run(scenario())
    assert code == 1000 and second[-1]["type"] == "end"
    assert_batch_frames(first + second)
    assert any(len(f["items"]) == BATCH_MAX_ITEMS for f in first if f["type"] == "batch")
    assert steps_of(first) + steps_of(second) == list(range(1, 1001))
    events = [m["data"]["type"] for m in records(first + second) if m["type"] == "event"]
    # No worker serves this stack's queues: the dispatcher's waiting_for_queue note may come.
    assert [e for e in events if e != "waiting_for_queue"] == ["queued", "started", "succeeded"]
    # The old client: one message per record, the same records at the same cursors.
    assert not any(m["type"] == "batch" for m in plain)
    assert sequence(first + second) == sequence(plain)


TOTAL = 15_000


def test_a_stalled_batch_watcher_is_cut_off_while_others_stay_complete(
    stack: Stack, producer: Producer
) -> None:
    healthy, seen, code = stall_one_of_three(stack, producer, TOTAL, batch=True)
    for got, closed in healthy:
        assert closed == 1000 and steps_of(got) == list(range(1, TOTAL + 1))
        assert_batch_frames(got)
    assert_batch_frames(seen)
    steps = steps_of(seen)
    assert steps == list(range(1, len(steps) + 1)) and len(steps) < TOTAL
    assert code in (1013, None)  # a gap frame then 1013, or cut off before it could be sent
    batches = [m for m in seen if m["type"] == "batch"]
    gaps = [m for m in seen if m["type"] == "gap"]
    if gaps:
        assert gaps[0]["cursor"] == batches[-1]["cursor"]
    # The last batch's cursor resumes it without loss.
    rest, code = asyncio.run(watch(stack, producer.job_id, after=batches[-1]["cursor"], batch=True))
    assert steps + steps_of(rest) == list(range(1, TOTAL + 1)) and code == 1000


def test_sse_batch_frames_resume_with_their_id(stack: Stack, producer: Producer) -> None:
    producer.start()
    producer.steps(1, 50)
    first, _ = read_sse(stack, producer.job_id, {"batch": "true"}, stop_at_step=50)
    producer.steps(51, 80)
    producer.finish(step=80)
    rest, _ = read_sse(stack, producer.job_id, {"batch": "true", "after": first[-1]["cursor"]})
    assert_batch_frames(first + rest)
    assert steps_of(first) + steps_of(rest) == list(range(1, 81))
    assert rest[-1]["type"] == "end" and rest[-1]["data"]["status"] == "succeeded"
    # The documented schema names the opt-in and the message type.
    stream = stack.client.get("/openapi.json").json()["paths"]["/jobs/{job_id}/stream"]["get"]
    assert "batch" in {p["name"] for p in stream["parameters"]}
    assert '"batch"' in stream["description"] or "``batch``" in stream["description"]
