"""Dispatch: committed jobs reach the Celery queue by task name, even after a broker outage."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.spec import JobSpec
from amptrain.core.enums import TaskName
from amptrain.core.redis import Keys
from amptrain.core.settings import Settings
from amptrain.server import reconciler
from amptrain.server.broker import queue_lists
from amptrain.server.dispatcher import Dispatcher
from amptrain.store import jobs, migrate
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.models import Job, JobEvent, utcnow
from tests.support.specs import mlp_job
from tests.support.stack import Stack, wait_until


def queued_messages(server: EmbeddedRedis, queue: str) -> list[dict[str, Any]]:
    """The Celery messages waiting in ``queue``: kombu's Redis transport keeps a list per
    priority step of a queue (a worker empties the first before it takes from the next),
    each newest first."""
    client = redis.Redis(unix_socket_path=str(server.socket))
    try:
        raw = [m for key in queue_lists(queue) for m in client.lrange(key, 0, -1)]
    finally:
        client.close()
    out = []
    for item in raw:
        message = json.loads(item)
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        out.append({"task": message["headers"]["task"], "args": args, "kwargs": kwargs})
    return out


def job_row(database_url: str, job_id: str) -> Job:
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as s:
            job = s.get(Job, job_id)
            assert job is not None
            return job
    finally:
        engine.dispose()


def test_jobs_are_sent_by_name_to_the_queue_of_their_device(
    api_stack: Stack, redis_server: EmbeddedRedis, database_url: str
) -> None:
    cpu = api_stack.submit(mlp_job(3))
    gpu = api_stack.submit(mlp_job(3, device="auto"))
    a100 = api_stack.submit(mlp_job(3, device="cuda", queue="gpu-a100"))
    expected = {"task": TaskName.RUN_JOB, "args": [cpu["id"]], "kwargs": {}}
    assert wait_until(lambda: queued_messages(redis_server, "cpu"), 10, "cpu message") == [expected]
    gpu_messages = wait_until(lambda: queued_messages(redis_server, "gpu"), 10, "gpu message")
    assert [m["args"] for m in gpu_messages] == [[gpu["id"]]]
    # A spec that names a queue reaches only workers started with -Q for it.
    a100_messages = wait_until(
        lambda: queued_messages(redis_server, "gpu-a100"), 10, "gpu-a100 message"
    )
    assert [m["args"] for m in a100_messages] == [[a100["id"]]]
    assert wait_until(lambda: job_row(database_url, cpu["id"]).dispatched_at, 10, "dispatched_at")


def test_a_queue_can_never_name_the_transports_own_keys(
    api_stack: Stack, redis_server: EmbeddedRedis, database_url: str
) -> None:
    # kombu keeps each queue as a Redis list of that name; "unacked" is its own hash.
    for name in ("unacked", "unacked_index", "celery", "gpu-h100"):
        r = api_stack.client.post("/jobs", json=mlp_job(3, queue=name))
        assert r.status_code == 422, r.text
        problem = r.json()["detail"][0]
        assert problem["field"] == "queue" and "gpu-a100" in problem["message"], problem
    # A job whose queue the settings no longer allow (removed while it waited) is failed,
    # never sent.
    engine = make_engine(database_url)
    with make_session_factory(engine).begin() as s:
        job_id = jobs.create_job(s, JobSpec.model_validate(mlp_job(3)), "admin", "unacked").id
    engine.dispose()
    row = wait_until(
        lambda: (j := job_row(database_url, job_id)).status == "failed" and j, 10, "rejected"
    )
    assert row.error_code == "invalid_spec" and "unacked" in (row.error_message or "")
    client = redis.Redis(unix_socket_path=str(redis_server.socket))
    try:
        assert client.type("unacked") != b"list"  # nothing was pushed onto kombu's own key
    finally:
        client.close()
    # The service still dispatches ordinary jobs.
    ok = api_stack.submit(mlp_job(3))
    assert wait_until(lambda: queued_messages(redis_server, "cpu"), 10, "cpu message")[-1][
        "args"
    ] == [ok["id"]]


def test_broker_down_at_submit_is_sent_once_redis_returns(
    api_stack: Stack, redis_server: EmbeddedRedis, database_url: str
) -> None:
    redis_server.stop()
    started = time.monotonic()
    r = api_stack.client.post("/jobs", json=mlp_job(3))
    elapsed = time.monotonic() - started
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "queued"
    assert elapsed < 2.0, f"a dead broker slowed the request: {elapsed:.2f}s"
    ready = api_stack.client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["detail"]["redis"] != "ok"
    job_id = r.json()["id"]
    assert job_row(database_url, job_id).dispatched_at is None

    redis_server.start()
    messages = wait_until(lambda: queued_messages(redis_server, "cpu"), 20, "the re-sent job")
    assert [m["args"] for m in messages] == [[job_id]]
    assert wait_until(lambda: job_row(database_url, job_id).dispatched_at, 10, "dispatched_at")
    assert api_stack.client.get("/readyz").status_code == 200


def test_only_one_dispatcher_leads(session_redis: EmbeddedRedis, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    settings = Settings(data_dir=tmp_path, database_url=url, redis_url=session_redis.url)
    engine = make_engine(url)
    client = redis.Redis.from_url(session_redis.url)
    client.delete(Keys.DISPATCHER_LEADER)
    a, b = (Dispatcher(settings, make_session_factory(engine), client) for _ in range(2))
    try:
        assert a.lead() and not b.lead()
        assert a.lead() and not b.lead()  # renewing keeps it
        a._resign()
        assert b.lead() and not a.lead()
    finally:
        b._resign()
        a.close()
        b.close()
        client.close()
        engine.dispose()


@pytest.fixture
def dispatcher(
    database_url: str, redis_server: EmbeddedRedis, tmp_path: Path
) -> Iterator[Dispatcher]:
    migrate.upgrade(database_url)
    settings = Settings(data_dir=tmp_path, database_url=database_url, redis_url=redis_server.url)
    engine = make_engine(database_url)
    client = redis.Redis.from_url(redis_server.url)
    d = Dispatcher(settings, make_session_factory(engine), client)
    yield d
    d.close()
    client.close()
    engine.dispose()


def new_job(d: Dispatcher, **extra: Any) -> str:
    with d.sessions() as s:
        job = jobs.create_job(s, JobSpec.model_validate(mlp_job(3, **extra)), "admin", "cpu")
        s.commit()
        return job.id


def test_reconciler_requeues_or_fails_attempts_whose_lease_expired(dispatcher: Dispatcher) -> None:
    retry, last = new_job(dispatcher, max_attempts=2), new_job(dispatcher, max_attempts=1)
    with dispatcher.sessions() as s:
        assert jobs.claim(s, retry, "w", 0.01) == 1 and jobs.claim(s, last, "w", 0.01) == 1
        s.commit()
    live = new_job(dispatcher)
    with dispatcher.sessions() as s:
        assert jobs.claim(s, live, "w", 60) == 1
        s.commit()
    # The two 10 ms leases expire at two instants (each claim reads the database clock),
    # so one pass may reap only the first: count across passes.
    reaped: list[int] = []
    wait_until(
        lambda: (
            reaped.append(reconciler.reap_expired_leases(dispatcher.sessions)) or sum(reaped) >= 2
        ),
        5,
        "two expired leases",
    )
    assert sum(reaped) == 2
    with dispatcher.sessions() as s:
        requeued, failed, running = (s.get(Job, i) for i in (retry, last, live))
        assert requeued and failed and running
        assert (requeued.status, requeued.dispatched_at, requeued.attempt) == ("queued", None, 1)
        assert (failed.status, failed.error_code) == ("failed", "worker_lost")
        assert running.status == "running"
        types = {
            i: [
                e.type
                for e in s.scalars(
                    sa.select(JobEvent).where(JobEvent.job_id == i).order_by(JobEvent.id)
                )
            ]
            for i in (retry, last)
        }
    assert types == {retry: ["queued", "warning"], last: ["queued", "failed"]}
    assert reconciler.reap_expired_leases(dispatcher.sessions) == 0
    fresh = new_job(dispatcher)  # submitted after `retry`, sent before it is re-sent
    assert dispatcher.send(fresh, "cpu")
    assert dispatcher.sweep_once() == 1  # the requeued job goes back to the broker
    # ... ahead of the job submitted after it: it keeps its place.
    assert queued_job_ids(dispatcher, "cpu") == [retry, fresh]


def test_lost_dispatches_are_sent_again(dispatcher: Dispatcher) -> None:
    waiting, lost = new_job(dispatcher), new_job(dispatcher)
    assert dispatcher.send(waiting, "cpu")  # its message sits in the queue
    long_ago = utcnow() - timedelta(minutes=10)
    with dispatcher.sessions() as s:
        s.execute(sa.update(Job).values(dispatched_at=long_ago, created_at=long_ago))
        s.commit()
    assert forget_lost(dispatcher) == 1
    with dispatcher.sessions() as s:
        assert s.get(Job, waiting).dispatched_at is not None  # type: ignore[union-attr]
        assert s.get(Job, lost).dispatched_at is None  # type: ignore[union-attr]
    assert dispatcher.sweep_once() == 1
    assert queued_job_ids(dispatcher, "cpu") == [waiting, lost]


def forget_lost(d: Dispatcher) -> int:
    return reconciler.forget_lost_dispatches(d.sessions, d.redis, d.settings.queues)


def queued_job_ids(d: Dispatcher, queue: str) -> list[str]:
    """The job ids in ``queue`` in the order a worker takes them: the priority lists in
    step order, each oldest first (kombu LPUSHes and BRPOPs)."""
    out = []
    for key in queue_lists(queue):
        for item in reversed(d.redis.lrange(key, 0, -1)):
            args, _, _ = json.loads(base64.b64decode(json.loads(item)["body"]))
            out.append(args[0])
    return out
