"""A ``nodes: 2`` job across two hosts (network namespaces on a bridge, each its own
address and hostname: tests/support/netns.py), each host running ``amptrain worker`` with
one cpu rank against the Redis on the bridge address and the SQLite database on the
shared file system; the API runs outside. Nothing may ride on 127.0.0.1: a launcher that
advertised loopback would fail here. The two nodes train like one process accumulating
the same micro-batches; then one host's cable is cut mid-job: the attempt ends on every
node within the collective timeout and a margin, and once the cable is back the job is
retried and resumes from its checkpoint, every step recorded once."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.support.netns import IFNAME, Host, Network
from tests.support.probe import ROOT, probe_paths
from tests.support.processes import running
from tests.support.stack import Stack, wait_until
from tests.system.test_ddp_jobs import checkpointed
from tests.system.test_e2e_service import wait_for_points
from tests.system.test_nodes import COLLECTIVE_S, STEPS, first_start, node_pids, nodes_job

pytestmark = pytest.mark.slow

MARGIN_S = 25  # a loaded 2-core machine: rank teardown, the monitor's polls, the 5 s sink close


class NetnsStack(Stack):
    """The stack with each worker on a host of its own (by name: ``h0``, ``h1``)."""

    def __init__(
        self, root: Path, database_url: str, redis: EmbeddedRedis, hosts: dict[str, Host]
    ) -> None:
        super().__init__(root, database_url, redis)
        self.hosts = hosts
        self.redis = redis

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        host = self.hosts.get(name)
        if host is None:
            return super().spawn(name, args)
        env = {
            **self.env,
            "AMPTRAIN_REDIS_URL": self.redis.tcp_url,  # the bridge address, not a socket
            "AMPTRAIN_NODE_ADDRESS": host.addr,
            "GLOO_SOCKET_IFNAME": IFNAME,
        }
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        proc = host.popen([*self.entry(name), *args], env=env, stdout=log, stderr=subprocess.STDOUT)
        self.processes[name] = proc
        return proc

    def close(self) -> None:
        # A host's worker is not a group leader here (``ip netns exec`` runs it): stop it
        # by pid; the fixture then kills whatever is left in the namespaces.
        for name in self.hosts:
            proc = self.processes.pop(name, None)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        super().close()


@pytest.mark.timeout(600)  # about 100 s alone: two jobs, one retried after a cable cut
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_two_hosts_train_one_job_and_a_cut_cable_ends_the_attempt_everywhere(
    netns_hosts: Callable[[int], Network], database_url: str, tmp_path: Path
) -> None:
    net = netns_hosts(2)
    redis = net.start_redis()
    hosts = {f"h{i}": h for i, h in enumerate(net.hosts)}
    stack = NetnsStack(tmp_path, database_url, redis, hosts)
    stack.env["PYTHONPATH"] = os.pathsep.join(map(str, [*probe_paths(tmp_path), ROOT]))
    stack.env["AMPTRAIN_WORKER_METRICS_PORT"] = "0"
    stack.env["AMPTRAIN_NODE_WAIT_SECONDS"] = "5"
    try:
        stack.start_api()
        for name in hosts:
            stack.start_worker(name, "cpu")

        two = stack.submit(nodes_job("two-hosts"))
        done = stack.wait_for_status(two["id"], "succeeded", "failed", timeout=180)
        assert done["status"] == "succeeded", done["error"]
        _, process = first_start(stack, two["id"])
        assert sorted(n["address"] for n in process["nodes"]) == sorted(h.addr for h in net.hosts)
        one = stack.submit(nodes_job("one-process", nodes=1))
        done = stack.wait_for_status(one["id"], "succeeded", "failed", timeout=120)
        assert done["status"] == "succeeded", done["error"]
        ours, reference = (wait_for_points(stack, j["id"], STEPS) for j in (two, one))
        assert [p["step"] for p in ours] == list(range(1, STEPS + 1))
        assert [p["loss"] for p in ours] == pytest.approx([p["loss"] for p in reference], rel=1e-6)

        # Rank 1 waits at step 12 (checkpoint 10 written) until the cable is cut.
        gate = tmp_path / "go"
        job = stack.submit(nodes_job("cut", hang_rank=1, hang_at=12, hang_until=str(gate)))
        attempt, process = first_start(stack, job["id"])
        pids = node_pids(process)
        wait_until(lambda: checkpointed(stack, job["id"], 10), 120, "checkpoint 10")
        follower = next(n for n in process["nodes"] if n["node"] == 1)
        cut = next(h for h in net.hosts if h.addr == follower["address"])
        cut.cut()
        gate.touch()
        cut_at = time.monotonic()
        wait_until(
            lambda: not any(map(running, pids.values())),
            COLLECTIVE_S + MARGIN_S,
            "every node's ranks to end",
        )
        ended_in = time.monotonic() - cut_at
        # The leader gives up on the silent node and names it; then the cable comes back
        # (with one host alone, the retry waits for the other: all or nothing).
        (requeued,) = wait_until(
            lambda: [e for e in stack.events(job["id"]) if e["type"] == "requeued"],
            COLLECTIVE_S + 60,
            "the attempt to be given back",
        )
        assert follower["address"] in requeued["data"]["error"]["message"], requeued
        cut.restore()
        done = stack.wait_for_status(job["id"], "succeeded", "failed", timeout=240)
        assert done["status"] == "succeeded" and done["attempt"] > attempt, done["error"]
        resumed = [e for e in stack.events(job["id"]) if e["type"] == "resumed"]
        assert [(e["attempt"], e["data"]["from_step"]) for e in resumed] == [(done["attempt"], 10)]
        points = wait_for_points(stack, job["id"], STEPS)
        assert [p["step"] for p in points] == list(range(1, STEPS + 1))
        assert ended_in < COLLECTIVE_S + MARGIN_S
    finally:
        stack.close()
