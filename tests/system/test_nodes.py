"""One job on two machines (``nodes: 2``), each machine an ``amptrain worker`` on this host
(loopback: two torchrun agents with ``--rdzv-endpoint 127.0.0.1:PORT --nnodes 2`` form one
world), through the real service: the service's maximum, the all-or-nothing placement
(a job that cannot get its nodes waits, says why and holds no worker), a world of two
nodes that trains like one process accumulating the same micro-batches, a rank killed on
one node (every node's attempt ends, the retry resumes from the checkpoint, every step
is recorded once, the error names the node), and a cancel that stops both nodes at one
step. The probe plugin's gate holds a rank at a known step."""

from __future__ import annotations

import os
import random
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core.enums import TaskName
from amptrain.core.settings import Settings
from amptrain.server.dispatcher import make_celery
from tests.support.probe import ROOT, probe_paths
from tests.support.processes import running
from tests.support.stack import Stack, wait_until
from tests.system.test_ddp_jobs import checkpointed, ddp_job, started
from tests.system.test_e2e_service import wait_for_points

pytestmark = pytest.mark.slow

STEPS = 16
WAIT_S = 5  # AMPTRAIN_NODE_WAIT_SECONDS: how long a leader waits for the other node
COLLECTIVE_S = 10


def nodes_job(name: str, nodes: int = 2, **probe: Any) -> dict[str, Any]:
    """fp32 on the CPU: two nodes of one process each split what one process accumulates."""
    return {
        **ddp_job(name, **probe),
        "nodes": nodes,
        "devices": 1,
        "grad_accum_steps": 1 if nodes > 1 else 2,
        "max_steps": STEPS,
        "telemetry": {"flush_every_steps": 2},
        "checkpoint": {"every_steps": 5, "keep_last": 10},
        "collective_timeout_s": COLLECTIVE_S,
    }


@pytest.fixture
def nodes_stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.env["PYTHONPATH"] = os.pathsep.join(map(str, [*probe_paths(tmp_path), ROOT]))
    s.env["AMPTRAIN_WORKER_METRICS_PORT"] = "0"
    s.env["AMPTRAIN_MAX_NODES"] = "2"
    s.env["AMPTRAIN_NODE_ADDRESS"] = "127.0.0.1"
    low = random.randrange(42000, 60000, 100)  # apart from a parallel run's ranges
    s.env["AMPTRAIN_RDZV_PORTS"] = f"{low}-{low + 99}"
    s.env["AMPTRAIN_NODE_WAIT_SECONDS"] = str(WAIT_S)
    s.start_api()
    yield s
    s.close()


def events_of(stack: Stack, job_id: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in stack.events(job_id) if e["type"] == kind]


def first_start(stack: Stack, job_id: str) -> tuple[int, dict[str, Any]]:
    """The attempt that first started training, and its ``started`` event's process (an
    attempt that could not reserve its nodes in time never starts)."""

    def find() -> tuple[int, dict[str, Any]] | None:
        for e in stack.events(job_id):
            if e["type"] == "started":
                return int(e["attempt"]), dict(e["data"]["process"])
        return None

    return wait_until(find, 180, f"{job_id} to start")


def node_pids(process: dict[str, Any]) -> dict[int, int]:
    """Global rank -> pid, over every node of a ``started`` event's process."""
    return {r["rank"]: r["pid"] for node in process["nodes"] for r in node["ranks"]}


def ended_at_one_step(
    logs: Callable[[], str], job_id: str, attempt: int, how: str, timeout: float
) -> int:
    """The step at which both nodes' ranks of ``attempt`` ended ``how`` (``cancelled``,
    ``preempted``): one step, from the log line that says how the multi-node attempt ended."""
    mine = f"{job_id} #{attempt}]"
    ended = wait_until(
        lambda: re.search(rf"{re.escape(mine)}.*multi-node attempt ended: (.*)", logs()),
        timeout,
        "the nodes' ends",
    )
    steps = re.findall(rf"{how} at step (\d+)", ended[1])
    assert len(steps) == 2 and steps[0] == steps[1], ended[1]
    return int(steps[0])


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_two_node_job_waits_holding_nothing_then_trains_like_one_process(
    nodes_stack: Stack,
) -> None:
    stack = nodes_stack
    r = stack.client.post("/jobs", json=nodes_job("too-many", nodes=4))
    assert r.status_code == 422, r.text
    assert "at most 2 nodes on this service; got 4" in r.text and '"nodes"' in r.text

    stack.start_worker("a", "cpu")
    two = stack.submit(nodes_job("two-nodes"))

    def reserved() -> list[dict[str, Any]]:
        slots = [j for w in stack.client.get("/workers").json()["items"] for j in w["current_jobs"]]
        return [j for j in slots if j.get("reservation") == "waiting"]

    (slot,) = wait_until(reserved, 60, "GET /workers to show the reservation")
    assert (slot["job_id"], slot["node"]) == (two["id"], 0)
    said = wait_until(lambda: events_of(stack, two["id"], "waiting_for_nodes"), 60, "the wait")
    assert said[0]["data"]["message"].startswith(
        "needs 2 workers with a free cpu slot (queue cpu); 1 has one"
    )
    # It holds nothing: the one worker trains a one-process job meanwhile (the reference:
    # one process accumulating the two micro-batches the two nodes split).
    one = stack.submit(nodes_job("one-process", nodes=1))
    done = stack.wait_for_status(one["id"], "succeeded", "failed", timeout=120)
    assert done["status"] == "succeeded", done["error"]
    waiting = stack.job(two["id"])
    assert waiting["status"] == "queued" and waiting["error"] is None

    stack.start_worker("b", "cpu")
    done = stack.wait_for_status(two["id"], "succeeded", "failed", timeout=180)
    assert done["status"] == "succeeded", done["error"]
    process = started(stack, two["id"], done["attempt"])["process"]
    assert sorted(n["worker"] for n in process["nodes"]) == ["a@test", "b@test"]
    assert sorted(node_pids(process)) == [0, 1] and process["world_size"] == 2
    assert [n["address"] for n in process["nodes"]] == ["127.0.0.1"] * 2
    shown = stack.job(two["id"])  # GET /jobs/{id} (an admin's token): the nodes, ranks
    assert shown["nodes_attempt"] == done["attempt"]
    assert sorted(n["worker"] for n in shown["nodes"]) == ["a@test", "b@test"]
    assert sorted(r["rank"] for n in shown["nodes"] for r in n["ranks"]) == [0, 1]

    ours, reference = (wait_for_points(stack, j["id"], STEPS) for j in (two, one))
    assert [p["step"] for p in ours] == list(range(1, STEPS + 1))
    # The same micro-batches, gradients all-reduced: the losses agree to float32 rounding.
    # Not bitwise: the reported loss is reduced differently (each node's mean, averaged
    # across the world, against one process's accumulated mean), which differs by an ulp
    # already at step 1, before any update; the weights stay in step (tests/engine/
    # test_ddp.py holds DDP's weights bitwise to one process's).
    assert [p["loss"] for p in ours] == pytest.approx([p["loss"] for p in reference], rel=1e-6)
    items = stack.client.get(f"/jobs/{two['id']}/checkpoints").json()["items"]
    assert sorted(c["step"] for c in items) == [5, 10, 15, 16]  # rank 0's, once each


@pytest.mark.timeout(600)  # 55 s alone, 83 s beside two busy cores: four jobs, one retried
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_lost_rank_ends_every_node_and_a_cancel_stops_both_at_one_step(
    nodes_stack: Stack, tmp_path: Path
) -> None:
    stack = nodes_stack
    stack.start_worker("a", "cpu")
    stack.start_worker("b", "cpu")
    gate = tmp_path / "go"
    job = stack.submit(nodes_job("lose-a-rank", hang_rank=1, hang_at=12, hang_until=str(gate)))
    attempt, process = first_start(stack, job["id"])
    pids = node_pids(process)
    wait_until(lambda: checkpointed(stack, job["id"], 10), 120, "checkpoint 10")
    killed_at = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)
    wait_until(lambda: not any(map(running, pids.values())), COLLECTIVE_S + 20, "every rank to end")
    ended_in = time.monotonic() - killed_at
    assert ended_in < COLLECTIVE_S + 20
    gate.touch()

    done = stack.wait_for_status(job["id"], "succeeded", "failed", timeout=180)
    assert done["status"] == "succeeded" and done["attempt"] > attempt, done["error"]
    resumed = events_of(stack, job["id"], "resumed")
    assert [(e["attempt"], e["data"]["from_step"]) for e in resumed] == [(done["attempt"], 10)]
    points = wait_for_points(stack, job["id"], STEPS)
    assert [p["step"] for p in points] == list(range(1, STEPS + 1))
    (requeued,) = events_of(stack, job["id"], "requeued")
    lost = next(n for n in process["nodes"] if any(r["rank"] == 1 for r in n["ranks"]))
    named = f"node {lost['node']} ({lost['worker']}, 127.0.0.1)"
    assert named in requeued["data"]["error"]["message"], requeued

    # Cancel while rank 1 is held at step 5: both nodes stop at the flush that carries it.
    gate2 = tmp_path / "go2"
    job = stack.submit(nodes_job("cancel", hang_rank=1, hang_at=5, hang_until=str(gate2)))
    attempt, process = first_start(stack, job["id"])
    assert stack.client.post(f"/jobs/{job['id']}/cancel").status_code == 202

    def logs() -> str:
        return stack.log_tail("a", 400) + "\n" + stack.log_tail("b", 400)

    wait_until(lambda: f"attempt {attempt}: asked child to cancel" in logs(), 30, "the cancel")
    gate2.touch()
    done = stack.wait_for_status(job["id"], "cancelled", "failed", timeout=120)
    assert done["status"] == "cancelled", done["error"]
    ended_at_one_step(logs, job["id"], attempt, "cancelled", 30)
    assert not any(map(running, node_pids(process).values()))

    # A drain of the follower's worker (SIGTERM to `amptrain worker` alone, as Kubernetes
    # sends it) reaches its ranks: both nodes checkpoint at one step, the job goes back.
    gate3 = tmp_path / "go3"
    job = stack.submit(nodes_job("drain", hang_rank=1, hang_at=5, hang_until=str(gate3)))
    attempt, process = first_start(stack, job["id"])
    follower = next(n for n in process["nodes"] if n["node"] == 1)["worker"].removesuffix("@test")
    stack.processes[follower].send_signal(signal.SIGTERM)
    wait_until(lambda: "asking this node's ranks to stop" in logs(), 30, "the drain")
    gate3.touch()
    step = ended_at_one_step(logs, job["id"], attempt, "preempted", 60)
    (requeued,) = wait_until(lambda: events_of(stack, job["id"], "requeued"), 30, "requeued")
    assert requeued["attempt"] == attempt and not requeued["data"].get("error"), requeued
    assert checkpointed(stack, job["id"], step)
    assert not any(map(running, node_pids(process).values()))


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_dead_leader_leaves_no_follower_training_and_a_waiting_job_cancels(
    nodes_stack: Stack, tmp_path: Path
) -> None:
    stack = nodes_stack
    stack.start_worker("a", "cpu")
    stack.start_worker("b", "cpu")
    # Anyone who can write to the broker can send a join: malformed ones are dropped, and
    # one naming no reservation takes nothing.
    celery = make_celery(Settings(redis_url=stack.redis_server.url))
    some_job = "j_" + "0" * 32
    bad = [[], [some_job], ["../etc", 1], [some_job, True], [some_job, 0], [some_job, "1"]]
    for i, args in enumerate([*bad, [some_job, 1, 2]]):
        celery.send_task(TaskName.JOIN_JOB, args=args, queue="cpu", task_id=f"bad-join-{i}")
    celery.send_task(TaskName.JOIN_JOB, args=[some_job, 3], queue="cpu", task_id="no-such")

    def logs() -> str:
        return stack.log_tail("a", 400) + stack.log_tail("b", 400)

    for i in range(len(bad) + 1):
        wait_until(lambda i=i: f"message bad-join-{i}: expected" in logs(), 60, f"bad join {i}")
    wait_until(lambda: f"join of {some_job} #3: no such reservation" in logs(), 60, "no-such")
    assert "Traceback" not in logs()

    gate = tmp_path / "go"  # rank 1 waits at step 5: the job is mid-way when its leader dies
    job = stack.submit(nodes_job("lose-the-leader", hang_rank=1, hang_at=5, hang_until=str(gate)))
    attempt, process = first_start(stack, job["id"])
    leader, follower = sorted(process["nodes"], key=lambda n: n["node"])
    followers = [r["pid"] for r in follower["ranks"]]
    killed_at = time.monotonic()
    stack.kill(leader["worker"].removesuffix("@test"))  # SIGKILL: worker, pool, launcher
    lease_s = float(stack.env["AMPTRAIN_LEASE_SECONDS"])
    wait_until(
        lambda: not any(map(running, followers)),
        lease_s + COLLECTIVE_S + 20,
        "the follower's ranks",
    )
    assert time.monotonic() - killed_at < lease_s + COLLECTIVE_S + 20
    gate.touch()
    # The reconciler takes the job back once the lease expired; one worker is left, so it
    # waits for a second one, and a cancel ends it wherever it is (placing or queued).
    wait_until(lambda: stack.job(job["id"])["attempt"] > attempt, 60, "the job to be taken back")
    assert stack.client.post(f"/jobs/{job['id']}/cancel").status_code == 202
    done = stack.wait_for_status(job["id"], "cancelled", "failed", "succeeded", timeout=60)
    assert done["status"] == "cancelled", done
