"""A multi-node attempt's reservation on a real Redis: joins are atomic (never more nodes
than asked, never into another attempt's or a reservation that is gone), and the reason a
job waits names how many workers it needs and how many have a free slot."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core import redis as amptrain_redis
from amptrain.worker.child.protocol import Failed, Finished
from amptrain.worker.pool.node_verdict import NodeOutcome, nodes_outcome
from amptrain.worker.pool.placement import free_port, wait_reason
from amptrain.worker.pool.reservation import GO, Member, Reservation, Shape

JOB = "j_0123456789abcdef0123456789abcdef"
CPU = Shape(devices=1, gpu=False)
LEADER = Member(0, "a@host", "10.0.0.1", 0)


@pytest.fixture
def client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    c = amptrain_redis.client(redis_server.url)
    yield c
    c.close()


def test_joins_are_atomic_and_never_more_than_asked(client: redis.Redis) -> None:
    Reservation(client, JOB, 3).create(4, CPU, LEADER, "10.0.0.1:29400", ttl_s=30)

    def join(i: int) -> Member | None:
        return Reservation(client, JOB, 3).join(f"w{i}@host", f"10.0.0.{i + 2}", 0)

    with ThreadPoolExecutor(8) as pool:
        got = [m for m in pool.map(join, range(8)) if m is not None]
    assert sorted(m.node for m in got) == [1, 2, 3]  # 4 nodes: the leader and three
    members = Reservation(client, JOB, 3).members()
    assert [m.node for m in members] == [0, 1, 2, 3] and members[0] == LEADER
    assert {m.worker for m in members[1:]} == {m.worker for m in got}


def test_a_join_of_another_attempt_or_a_gone_reservation_takes_nothing(
    client: redis.Redis,
) -> None:
    assert Reservation(client, JOB, 1).join("w@host", "10.0.0.2", 0) is None  # none yet
    leader = Reservation(client, JOB, 2)
    leader.create(2, CPU, LEADER, "10.0.0.1:29400", ttl_s=30)
    stale = Reservation(client, JOB, 1)  # a join message left from attempt 1
    assert stale.fields() is None and stale.join("w@host", "10.0.0.2", 0) is None
    assert not stale.renew(30) and leader.joined() == 0
    stale.delete()  # an older attempt cannot end the new one's reservation
    assert leader.fields() is not None
    assert leader.go('{"x": 1}') and leader.fields()["state"] == GO  # type: ignore[index]
    assert Reservation(client, JOB, 2).join("w@host", "10.0.0.2", 0) is None  # not waiting
    leader.close()
    assert leader.fields() is None and not leader.renew(30) and not leader.go("{}")


def test_a_reservation_lapses_unless_renewed(client: redis.Redis) -> None:
    res = Reservation(client, JOB, 1)
    res.create(2, CPU, LEADER, "10.0.0.1:29400", ttl_s=30)
    assert 0 < client.pttl(res.key) <= 30_000
    assert res.renew(60) and client.pttl(res.key) > 30_000


def test_the_wait_reason_counts_free_slots_of_the_queue() -> None:
    def worker(queues: list[str], concurrency: int, busy: int, **more: object) -> dict[str, object]:
        jobs = [{"job_id": f"j{i}"} for i in range(busy)]
        return {"queues": queues, "concurrency": concurrency, "current_jobs": jobs, **more}

    workers = [
        worker(["cpu"], 1, 1),  # the leader's own worker: busy placing
        worker(["cpu"], 2, 1),  # one free slot
        worker(["gpu"], 1, 0),  # another queue
        worker(["cpu"], 1, 0, draining=True),  # takes nothing new
    ]
    message, have = wait_reason(3, CPU, "cpu", workers, joined=0)
    assert have == 2
    assert message == "needs 3 workers with a free cpu slot (queue cpu); 2 have one"
    message, have = wait_reason(2, Shape(2, True), "gpu-x2", [], joined=0)
    assert message == "needs 2 workers with a free 2-device gpu slot (queue gpu-x2); 1 has one"


def test_a_free_rendezvous_port_is_one_that_binds() -> None:
    port = free_port((40000, 40009))
    assert port is not None and 40000 <= port <= 40009
    with socket.socket() as taken:
        taken.bind(("", port))
        assert free_port((port, port)) is None


def test_nodes_outcomes_combine_naming_the_failed_node() -> None:
    done = Finished(final_step=8, resumed_from=None, skipped_steps=0, dropped_records=0)
    other = done.model_copy(update={"final_step": 7})
    a, b = LEADER, Member(1, "b@host", "10.0.0.2", 0)
    # Every node finished: the result of the node holding the world's rank 0.
    assert nodes_outcome([NodeOutcome(a, other), NodeOutcome(b, done, True)], 30) == done
    broken = Failed(code="internal", message="gloo: connection reset", step=None, retryable=True)
    lost = Failed(code="internal", message="process(es) 0 of 1 ended", step=None, retryable=True)
    got = nodes_outcome([NodeOutcome(a, broken), NodeOutcome(b, lost, lost_ranks=True)], 30)
    assert (
        got.type == "error" and got.message == "node 1 (b@host, 10.0.0.2): process(es) 0 of 1 ended"
    )
    silent = nodes_outcome([NodeOutcome(a, broken), NodeOutcome(b, None)], 30)
    assert isinstance(silent, Failed) and silent.message.startswith(
        "node 1 (b@host, 10.0.0.2) sent"
    )
    data = Failed(code="data_error", message="bad row", step=3, retryable=False)
    real = nodes_outcome([NodeOutcome(a, broken), NodeOutcome(b, data, lost_ranks=True)], 30)
    assert isinstance(real, Failed) and (real.code, real.retryable) == ("data_error", False)
    cancel = Failed(code="cancelled", message="cancelled", step=5, retryable=False)
    preempt = Failed(code="preempted", message="preempted", step=5, retryable=True)
    assert nodes_outcome([NodeOutcome(a, preempt), NodeOutcome(b, cancel)], 30) == cancel
