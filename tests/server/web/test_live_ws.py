"""WS /jobs/{id}/ws against a real uvicorn, a real Redis and a real database. The job's
telemetry comes from tests.support.producer (the worker's own RedisSink, driven step by
step so the tests decide when a watcher disconnects), and the API's recorder persists it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets
from websockets.exceptions import InvalidStatus

from amptrain.store import tokens
from amptrain.store.db import make_engine, make_session_factory
from tests.support.live import last_cursor, stall_one_of_three, steps_of, watch, ws_url
from tests.support.producer import Producer
from tests.support.stack import Stack, wait_until

pytestmark = pytest.mark.slow


def recorded_step(stack: Stack, job_id: str) -> int:
    return int(stack.job(job_id)["step"])


def test_reconnect_with_last_cursor_sees_every_step_once(stack: Stack, producer: Producer) -> None:
    job_id = producer.job_id
    producer.start()
    producer.steps(1, 30)
    producer.evals(30)
    wait_until(lambda: recorded_step(stack, job_id) == 30, 30, "steps 1-30 in SQL")
    producer.steps(31, 50)  # maybe not yet in SQL when the watcher connects: the seam
    producer.evals(50)

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int | None]:
        first, code = await watch(
            stack, job_id, until=lambda m: m["type"] == "metric" and m["data"]["step"] == 40
        )
        assert code is None
        # While nobody watches: more steps, some recorded, some only in the stream.
        producer.steps(41, 70)
        producer.evals(70)
        await asyncio.to_thread(
            wait_until, lambda: recorded_step(stack, job_id) >= 70, 30, "70 steps"
        )
        producer.steps(71, 90)
        producer.evals(90)

        async def finish_later() -> None:
            await asyncio.sleep(0.3)
            producer.steps(91, 100)
            producer.evals(100)
            producer.finish(step=100)

        task = asyncio.create_task(finish_later())
        second, code = await watch(stack, job_id, after=last_cursor(first))
        await task
        return first, second, code

    first, second, code = asyncio.run(scenario())
    assert steps_of(first) == list(range(1, 41))
    assert steps_of(second) == list(range(41, 101))
    assert code == 1000
    assert second[-1]["type"] == "end" and second[-1]["data"]["status"] == "succeeded"
    events = [m["data"]["type"] for m in first + second if m["type"] == "event"]
    assert [e for e in events if e != "waiting_for_queue"] == ["queued", "started", "succeeded"]
    cursors = [m["cursor"] for m in first + second if m["type"] in ("metric", "eval", "event")]
    assert len(set(cursors)) == len(cursors)
    # The same cursor GET /metrics uses: every point's cursor matches.
    points = stack.all_metrics(job_id)
    by_step = {m["data"]["step"]: m["cursor"] for m in first + second if m["type"] == "metric"}
    assert {p["step"]: p["cursor"] for p in points} == by_step
    # Each evaluation once, in place (from history, at the seam and live), at the cursor
    # GET /evals gives it (the one of step 50 follows step 50: the second watch has it).
    evals = [m for m in first + second if m["type"] == "eval"]
    assert [m["data"]["step"] for m in evals] == [30, 50, 70, 90, 100]
    assert [m["data"]["step"] for m in first if m["type"] == "eval"] == [30]
    page = stack.client.get(f"/jobs/{job_id}/evals").json()["items"]
    assert [(m["cursor"], m["data"]["values"]) for m in evals] == [
        (e["cursor"], e["values"]) for e in page
    ]


def test_finished_job_sends_history_then_end(stack: Stack, producer: Producer) -> None:
    producer.start()
    producer.steps(1, 25)
    producer.engine_event("checkpoint", 20, url="mem://ckpt")
    producer.finish(step=25)
    wait_until(lambda: stack.job(producer.job_id)["status"] == "succeeded", 30, "finished")
    got, code = asyncio.run(watch(stack, producer.job_id))
    assert code == 1000
    assert steps_of(got) == list(range(1, 26))
    # No worker serves this stack's queues: the dispatcher's waiting_for_queue note comes
    # or not, depending on whether the send won the race with the producer's claim.
    kinds = [
        (m["type"], m["data"].get("type"))
        for m in got
        if m["type"] != "metric" and m["data"].get("type") != "waiting_for_queue"
    ]
    assert kinds == [
        ("event", "queued"),
        ("event", "started"),
        ("event", "checkpoint"),
        ("event", "succeeded"),
        ("end", None),
    ]
    checkpoint = next(m for m in got if m["data"].get("type") == "checkpoint")
    assert checkpoint["data"]["step"] == 20
    # after= the checkpoint's cursor: only what followed it.
    rest, _ = asyncio.run(watch(stack, producer.job_id, after=checkpoint["cursor"]))
    assert steps_of(rest) == [] and rest[-1]["type"] == "end"
    tail, _ = asyncio.run(watch(stack, producer.job_id, after=got[10]["cursor"]))
    assert steps_of(tail) == list(range(steps_of(got[:11])[-1] + 1, 26))
    # The same run, downsampled over HTTP.
    page = stack.client.get(
        f"/jobs/{producer.job_id}/metrics", params={"max_points": 8, "fields": "loss"}
    ).json()
    metric_cursor = last_cursor([m for m in got if m["type"] == "metric"])
    assert 0 < len(page["items"]) <= 8 and page["next_cursor"] == metric_cursor
    assert set(page["items"][0]) == {
        *("step", "attempt", "cursor", "downsampled", "bucket_last", "loss")
    }
    assert page["items"][0]["step"] == 1 and page["items"][-1]["step"] == 25
    bad = stack.client.get(f"/jobs/{producer.job_id}/metrics", params={"fields": "nope"})
    assert bad.status_code == 422


def test_fifty_watchers_see_the_same_complete_sequence(stack: Stack, producer: Producer) -> None:
    producer.start()
    producer.steps(1, 10)

    async def scenario() -> list[list[dict[str, Any]]]:
        watchers = [asyncio.create_task(watch(stack, producer.job_id)) for _ in range(50)]
        await asyncio.sleep(0.5)
        for first in range(11, 101, 10):
            producer.steps(first, first + 9)
            await asyncio.sleep(0.05)
        producer.finish(step=100)
        return [got for got, code in await asyncio.gather(*watchers) if code == 1000]

    results = asyncio.run(scenario())
    assert len(results) == 50
    data = [[(m["type"], m["cursor"]) for m in got if m["type"] != "heartbeat"] for got in results]
    for i, d in enumerate(data):
        at = next((k for k, (a, b) in enumerate(zip(d, data[0], strict=False)) if a != b), None)
        where = min(len(d), len(data[0])) if at is None else at
        assert d == data[0], (
            i,
            len(d),
            len(data[0]),
            d[where - 2 : where + 3],
            data[0][where - 2 : where + 3],
        )
    assert steps_of(results[0]) == list(range(1, 101))


TOTAL = 15_000


def test_stalled_watcher_is_cut_off_while_others_stay_complete(
    stack: Stack, producer: Producer
) -> None:
    healthy, seen, code = stall_one_of_three(stack, producer, TOTAL)
    for got, closed in healthy:
        assert closed == 1000 and steps_of(got) == list(range(1, TOTAL + 1))
    steps = steps_of(seen)
    assert steps == list(range(1, len(steps) + 1)) and len(steps) < TOTAL
    assert code in (1013, None)  # a gap frame then 1013, or cut off before it could be sent
    gaps = [m for m in seen if m["type"] == "gap"]
    if gaps:
        assert gaps[0]["cursor"] == last_cursor(seen[: seen.index(gaps[0])])
    # The cursor it got last resumes it without loss.
    rest, code = asyncio.run(watch(stack, producer.job_id, after=last_cursor(seen)))
    assert steps + steps_of(rest) == list(range(1, TOTAL + 1)) and code == 1000


def test_heartbeats_while_idle(stack: Stack, producer: Producer) -> None:
    producer.start()
    producer.steps(1, 3)
    got, _ = asyncio.run(watch(stack, producer.job_id, until=lambda m: m["type"] == "heartbeat"))
    assert got[-1]["type"] == "heartbeat"
    assert got[-1]["cursor"] == last_cursor(got[:-1])


def test_handshake_refused_without_a_valid_token_or_for_a_foreign_job(
    stack: Stack, producer: Producer, database_url: str
) -> None:
    engine = make_engine(database_url)
    with make_session_factory(engine)() as s:
        other = tokens.create_token(s, "mallory")
        s.commit()
    engine.dispose()
    url = ws_url(stack, producer.job_id)

    async def refused(**kwargs: Any) -> int:
        with pytest.raises(InvalidStatus) as info:
            async with websockets.connect(url, **kwargs):
                pass
        return info.value.response.status_code

    async def scenario() -> None:
        assert await refused() == 403
        assert await refused(additional_headers={"Authorization": "Bearer nope"}) == 403
        assert await refused(subprotocols=["bearer", "nope"]) == 403
        assert await refused(additional_headers={"Authorization": f"Bearer {other}"}) == 403
        missing = ws_url(stack, "j_missing")
        with pytest.raises(InvalidStatus):
            async with websockets.connect(
                missing, additional_headers={"Authorization": f"Bearer {stack.token}"}
            ):
                pass
        # The browser way: subprotocols "bearer, TOKEN", answered with "bearer".
        async with websockets.connect(url, subprotocols=["bearer", stack.token]) as ws:  # type: ignore[list-item]
            assert ws.subprotocol == "bearer"
            assert (await asyncio.wait_for(ws.recv(), 10)) is not None

    asyncio.run(scenario())


def test_queued_job_cancelled_ends_the_watch(stack: Stack, producer: Producer) -> None:
    async def scenario() -> tuple[list[dict[str, Any]], int | None]:
        task = asyncio.create_task(watch(stack, producer.job_id))
        await asyncio.sleep(0.5)
        assert stack.client.post(f"/jobs/{producer.job_id}/cancel").status_code == 202
        return await task

    got, code = asyncio.run(scenario())
    assert code == 1000
    assert got[-1]["type"] == "end" and got[-1]["data"]["status"] == "cancelled"


def test_a_live_watcher_never_gets_a_step_twice_when_the_worker_re_sends(
    stack: Stack, producer: Producer
) -> None:
    producer.start()

    async def scenario() -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {stack.token}"}
        got: list[dict[str, Any]] = []
        async with websockets.connect(
            ws_url(stack, producer.job_id), additional_headers=headers
        ) as ws:
            producer.steps(1, 10)
            async for raw in ws:  # live: the watcher has step 10 before anything else is sent
                got.append(json.loads(raw))
                if got[-1]["type"] == "metric" and got[-1]["data"]["step"] == 10:
                    break
            # What the worker's sink does after Redis lost the tail of its stream.
            producer.evals(10)
            producer.steps(5, 10)
            producer.evals(10)
            producer.steps(11, 20)
            producer.finish(step=20)
            got += [json.loads(raw) async for raw in ws]
        return got

    got = asyncio.run(scenario())
    assert steps_of(got) == list(range(1, 21))
    assert [m["data"]["step"] for m in got if m["type"] == "eval"] == [10]
    assert got[-1]["type"] == "end"


def test_an_event_the_api_writes_reaches_live_and_history_at_one_cursor(
    stack: Stack, producer: Producer
) -> None:
    job_id = producer.job_id
    producer.start()
    producer.steps(1, 5)

    def cancelled(m: dict[str, Any]) -> bool:
        return m["type"] == "event" and m["data"]["type"] == "cancelled"

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        live = asyncio.create_task(watch(stack, job_id, until=cancelled))
        await asyncio.sleep(0.5)  # connected by now, or it reads the same from history
        producer.requeue(step=5)
        # Cancelled while re-queued: the API writes this event to SQL with the status.
        assert stack.client.post(f"/jobs/{job_id}/cancel").status_code == 202
        got, _ = await live
        again, _ = await watch(stack, job_id, until=cancelled)
        return got, again

    got, again = asyncio.run(scenario())

    def sequence(messages: list[dict[str, Any]]) -> list[tuple[str, str, Any]]:
        # Event "id" (the /events row id) is known only once recorded: not compared.
        return [
            (m["type"], m["cursor"], {k: v for k, v in m["data"].items() if k != "id"})
            for m in messages
            if m["type"] != "heartbeat"
        ]

    # No worker serves this stack's queues: whether the dispatcher's waiting_for_queue
    # note lands before the cancel is timing, and not what this test is about.
    assert [
        m["data"]["type"]
        for m in got
        if m["type"] == "event" and m["data"]["type"] != "waiting_for_queue"
    ] == [
        "queued",
        "started",
        "requeued",
        "cancelled",
    ]
    assert steps_of(got) == [1, 2, 3, 4, 5]
    assert sequence(got) == sequence(again)  # the same records at the same cursors


def test_an_event_re_sent_after_redis_lost_data_reaches_every_watcher_once(
    stack: Stack, producer: Producer
) -> None:
    producer.start()
    assert producer.sink is not None
    checkpoint = {"kind": "event", "type": "checkpoint", "step": 3, "time": 1234.5, "data": {}}

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        live = asyncio.create_task(watch(stack, producer.job_id))
        await asyncio.sleep(0.5)  # connected by now, or it reads the same from history
        producer.steps(1, 3)
        producer.sink.write([checkpoint])
        producer.sink.write([checkpoint])  # what the sink does after Redis lost its tail
        producer.steps(4, 5)
        producer.finish(step=5)
        got, _ = await live
        again, _ = await watch(stack, producer.job_id)
        return got, again

    got, again = asyncio.run(scenario())
    kinds = [m["data"]["type"] for m in got if m["type"] == "event"]
    kinds = [k for k in kinds if k != "waiting_for_queue"]  # no worker here: see above
    assert kinds == ["queued", "started", "checkpoint", "succeeded"]

    def sequence(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(m["type"], m["cursor"]) for m in messages if m["type"] != "heartbeat"]

    assert sequence(got) == sequence(again)
