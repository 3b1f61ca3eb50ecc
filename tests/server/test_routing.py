"""Routing by queue per job shape: a ``devices: N`` job goes to ``gpu-xN`` / ``cpu-xN`` (unless
its spec names a queue), the allow-list knows the shape queues, and a job sent to a queue
no live worker consumes says so once (``waiting_for_queue``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.spec import JobSpec
from amptrain.core import presence
from amptrain.core.settings import Settings
from amptrain.server.dispatcher import Dispatcher, queue_for
from amptrain.store import jobs
from amptrain.store.events import event_page
from amptrain.store.queue_waits import WAITING_FOR_QUEUE
from tests.server.test_dispatcher import queued_messages
from tests.support.specs import mlp_job
from tests.support.stack import Stack, wait_until

Sessions = sessionmaker[Session]


def spec(**overrides: Any) -> JobSpec:
    return JobSpec.model_validate(mlp_job(3, batch_size=64, **overrides))


def test_a_job_goes_to_the_queue_of_its_shape_unless_it_names_one() -> None:
    assert queue_for(spec(device="auto")) == "gpu"
    assert queue_for(spec(device="cpu")) == "cpu"
    assert queue_for(spec(device="auto", devices=2)) == "gpu-x2"
    assert queue_for(spec(device="cuda", devices=8)) == "gpu-x8"
    assert queue_for(spec(device="cpu", devices=2)) == "cpu-x2"
    assert queue_for(spec(device="cpu", devices=2, queue="cpu")) == "cpu"  # the spec wins
    assert queue_for(spec(devices=4, queue="gpu-a100")) == "gpu-a100"


def test_shape_queues_are_derived_from_the_configured_queues(tmp_path: Path) -> None:
    default = Settings(data_dir=tmp_path).routable_queues
    assert default[:2] == ["gpu", "cpu"]
    assert {f"gpu-x{n}" for n in range(2, 9)} | {f"cpu-x{n}" for n in range(2, 9)} <= set(default)
    assert "gpu-x1" not in default and "gpu-x9" not in default and len(default) == 16
    # A configured queue gets its shape queues too, as far as the 16 characters allow.
    custom = Settings(data_dir=tmp_path, queues="gpu,cpu,gpu-a100,a-very-long-name")
    assert "gpu-a100-x4" in custom.routable_queues
    assert not [q for q in custom.routable_queues if q.startswith("a-very-long-name-")]
    # kombu's own keys stay refused as configured queues.
    with pytest.raises(ValueError, match="unacked"):
        Settings(data_dir=tmp_path, queues="gpu,cpu,unacked")
    # A shape queue is derived, never configured (a one-device worker would consume it).
    with pytest.raises(ValueError, match="--devices-per-job"):
        Settings(data_dir=tmp_path, queues="gpu,cpu,gpu-x2")


@pytest.fixture
def dispatcher(
    sf: Sessions, redis_server: EmbeddedRedis, tmp_path: Path
) -> Iterator[tuple[Dispatcher, redis.Redis]]:
    settings = Settings(data_dir=tmp_path, redis_url=redis_server.url)
    client = redis.Redis.from_url(redis_server.url, socket_timeout=10)
    d = Dispatcher(settings, sf, client)
    yield d, client
    d.close()
    client.close()


def waits(sf: Sessions, job_id: str) -> list[dict[str, Any]]:
    with sf() as s:
        return [e for e in event_page(s, job_id, 0, 100) if e["type"] == WAITING_FOR_QUEUE]


def test_a_job_no_live_worker_serves_waits_and_says_so_once(
    sf: Sessions, redis_server: EmbeddedRedis, dispatcher: tuple[Dispatcher, redis.Redis]
) -> None:
    d, client = dispatcher
    with sf.begin() as s:
        job_id = jobs.create_job(s, spec(device="cpu", devices=2), "alice", "cpu-x2").id
    # A live worker of another shape does not serve it.
    presence.publish_worker(client, "one@host", {"queues": ["gpu", "cpu"]}, ttl_s=30)
    assert d.send(job_id, "cpu-x2") and d.send(job_id, "cpu-x2")  # e.g. re-sent by a sweep
    (said,) = waits(sf, job_id)
    assert said["attempt"] == 0 and said["data"]["queue"] == "cpu-x2"
    assert said["data"]["served_queues"] == ["cpu", "gpu"]
    assert "no live worker" in said["data"]["message"]
    assert [m["args"] for m in queued_messages(redis_server, "cpu-x2")] == [[job_id]] * 2
    # It is not failed: it stays queued for a worker that comes later.
    with sf() as s:
        job = jobs.get_job(s, job_id)
        assert job is not None and job.status == "queued"

    # A job whose queue a live worker consumes says nothing; nor does a draining worker count.
    presence.publish_worker(client, "two@host", {"queues": ["cpu-x2"]}, ttl_s=30)
    with sf.begin() as s:
        served = jobs.create_job(s, spec(device="cpu", devices=2), "alice", "cpu-x2").id
    assert d.send(served, "cpu-x2") and waits(sf, served) == []
    presence.publish_worker(client, "two@host", {"queues": ["cpu-x2"], "draining": True}, 30)
    with sf.begin() as s:
        drained = jobs.create_job(s, spec(device="cpu", devices=2), "alice", "cpu-x2").id
    assert d.send(drained, "cpu-x2") and len(waits(sf, drained)) == 1


def test_a_claimed_job_is_not_said_to_wait(
    sf: Sessions, dispatcher: tuple[Dispatcher, redis.Redis]
) -> None:
    d, _ = dispatcher
    with sf.begin() as s:
        job_id = jobs.create_job(s, spec(device="cpu"), "alice", "cpu").id
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w", 30) == 1
    assert d.send(job_id, "cpu") and waits(sf, job_id) == []


def test_submit_routes_by_shape_and_the_allow_list_names_what_is_allowed(
    api_stack: Stack, redis_server: EmbeddedRedis
) -> None:
    gpu2 = api_stack.submit(mlp_job(3, device="auto", devices=2, batch_size=64))
    cpu8 = api_stack.submit(mlp_job(3, device="cpu", devices=8, batch_size=64))  # not refused
    named = api_stack.submit(mlp_job(3, device="cpu", devices=2, batch_size=64, queue="cpu"))
    explicit = api_stack.submit(mlp_job(3, device="cpu", devices=4, batch_size=64, queue="cpu-x4"))
    for job, queue in ((gpu2, "gpu-x2"), (cpu8, "cpu-x8"), (named, "cpu"), (explicit, "cpu-x4")):
        got = wait_until(lambda q=queue: queued_messages(redis_server, q), 10, f"{queue} message")
        assert [m["args"] for m in got] == [[job["id"]]]
    # No worker runs here: each job says, once, that it waits for its queue.
    said = wait_until(
        lambda: [e for e in api_stack.events(cpu8["id"]) if e["type"] == WAITING_FOR_QUEUE],
        10,
        "the waiting_for_queue event",
    )
    assert [e["data"]["queue"] for e in said] == ["cpu-x8"]

    for name in ("gpu-x9", "gpu-x1", "unacked", "celery-x2"):
        r = api_stack.client.post("/jobs", json=mlp_job(3, queue=name))
        assert r.status_code == 422, r.text
        (problem,) = r.json()["detail"]
        assert problem["field"] == "queue"
        assert "gpu-x2" in problem["message"] and "cpu-x8" in problem["message"], problem
        assert "gpu-a100-x2" in problem["message"]  # derived from AMPTRAIN_QUEUES as well


def _worker(client: redis.Redis, name: str, queues: list[str], gpu: bool) -> None:
    devices: list[dict[str, Any]] = [{"type": "cpu"}, *([{"type": "cuda", "index": 0}] * gpu)]
    info = {"queues": queues, "devices": devices, "memory_available_bytes": 2**34}
    presence.publish_worker(client, name, info, ttl_s=600)


def test_a_device_auto_job_goes_where_the_machine_can_run_it(redis_server: EmbeddedRedis) -> None:
    """On a CPU-only machine (`amptrain up`: one worker of gpu and cpu, no GPU) a job that
    leaves the device to the service is queued on ``cpu``, where it trains, not on ``gpu``;
    once a worker with a GPU takes ``gpu`` jobs, ``gpu`` again."""
    from amptrain.server.web.admission import job_queue

    client = redis.Redis.from_url(redis_server.url)
    auto, cuda = spec(device="auto"), spec(device="cuda")
    assert job_queue(client, auto) == "gpu"  # no live worker: nothing known, as before
    _worker(client, "up@cpu-box", ["gpu", "cpu"], gpu=False)
    assert job_queue(client, auto) == "cpu"
    # No worker of either two-rank shape yet: the machine's one-device workers decide, and
    # `up` starts the cpu-x2 worker the waiting job needs.
    assert job_queue(client, spec(device="auto", devices=2)) == "cpu-x2"
    _worker(client, "up@cpu-box-x2", ["gpu-x2"], gpu=False)  # a shape worker says no GPU
    assert job_queue(client, spec(device="auto", devices=2)) == "gpu-x2"  # no cpu-x2 worker
    assert job_queue(client, cuda) == "gpu"  # asked for a GPU: it waits for one
    assert job_queue(client, spec(device="auto", queue="gpu")) == "gpu"  # named: kept
    _worker(client, "w@gpu-box", ["gpu"], gpu=True)
    assert job_queue(client, auto) == "gpu"
    client.close()
