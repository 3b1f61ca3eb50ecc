"""The netns hosts fixture itself, and PyTorch's multi-node launcher proven on it: two
agents on two hosts form one world over the hosts' own addresses."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.netns import Host, Network

PROBE = Path(__file__).with_name("rdzv_probe.py")
ROOT = Path(__file__).resolve().parents[2]

LISTEN = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 5000)); s.listen(); print("ready", flush=True)
while True: s.accept()[0].close()
"""
CONNECT = """
import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
"""


def reaches(source: Host, addr: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connect from ``source`` to ``addr:port`` succeeds within ``timeout``."""
    argv = [sys.executable, "-c", CONNECT, addr, str(port), str(timeout)]
    return source.run(argv, timeout=timeout + 20).returncode == 0


def test_hosts_reach_each_other_and_redis_on_their_addresses_and_a_cut_isolates(
    netns_hosts: Callable[[int], Network],
) -> None:
    net = netns_hosts(2)
    a, b = net.hosts
    assert len({a.addr, b.addr, net.bridge_addr}) == 3
    assert b.run(["hostname"]).stdout.strip() == b.name
    assert b.run(["getent", "hosts", a.name]).stdout.split()[0] == a.addr
    listener = a.popen([sys.executable, "-c", LISTEN, a.addr], stdout=subprocess.PIPE, text=True)
    assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
    redis = net.start_redis()
    ping = [sys.executable, "-c", f"import redis; redis.Redis.from_url({redis.tcp_url!r}).ping()"]
    assert reaches(b, a.addr, 5000)
    assert not reaches(b, "127.0.0.1", 5000)  # b's own loopback: a's listener is not there
    assert b.run(ping, cwd=ROOT).returncode == 0

    a.cut()
    started = time.monotonic()
    assert not reaches(b, a.addr, 5000, timeout=1.0)
    assert time.monotonic() - started < 10  # the connect failed, the probe did not hang
    assert not reaches(a, net.bridge_addr, redis.port, timeout=0.5)
    assert b.run(ping, cwd=ROOT).returncode == 0  # the others still talk

    a.restore()
    assert reaches(b, a.addr, 5000)
    assert a.run(ping, cwd=ROOT).returncode == 0


def test_torchrun_c10d_forms_one_world_across_two_hosts(
    netns_hosts: Callable[[int], Network], tmp_path: Path
) -> None:
    """The launch every node of a ``nodes: 2`` job runs, with the endpoint on host 0.

    Which agent hosts the rendezvous's TCPStore (torch 2.14.1,
    torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py ``_create_tcp_store``):
    ``--rdzv-conf is_host=true|false`` when given, else the agent whose hostname or
    addresses match the endpoint's host (``utils._matches_machine_hostname``: any loopback
    endpoint matches every agent). The store listens on every interface. Here the
    heuristic works because each host's hostname resolves to its own address; on hosts
    where the endpoint is an alias, pass ``is_host`` (true on node 0 only).
    ``MASTER_ADDR`` is the group-rank-0 agent's ``--local-addr``, else its
    ``socket.getfqdn()`` (dynamic_rendezvous.py ``_NodeDescGenerator.generate``): pass
    ``--local-addr`` so it is an address, not a name some host may resolve to loopback.
    The c10d backend reads ``join_timeout`` (default 600 s), not ``timeout``."""
    net = netns_hosts(2)
    endpoint = f"{net.hosts[0].addr}:29400"
    agents = []
    for host in net.hosts:
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
        argv += ["--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
        argv += ["--rdzv-id", f"probe-{net.tag}", "--max-restarts", "0"]
        argv += ["--rdzv-conf", "join_timeout=60", "--local-addr", host.addr]
        argv += [str(PROBE), str(tmp_path)]
        log = (tmp_path / f"{host.name}.log").open("w")
        agents.append(host.popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
    for host, agent in zip(net.hosts, agents, strict=True):
        if agent.wait(timeout=120) != 0:
            pytest.fail(f"{host} failed:\n{(tmp_path / f'{host.name}.log').read_text()[-3000:]}")
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    addrs = {h.addr for h in net.hosts}
    assert [s["rank"] for s in seen] == [0, 1]
    assert {s["world_size"] for s in seen} == {2}
    assert {s["rank_sum"] for s in seen} == {1.0}
    assert {s["hostname"] for s in seen} == {h.name for h in net.hosts}
    assert len({s["master_addr"] for s in seen}) == 1
    assert seen[0]["master_addr"] in addrs and seen[0]["master_addr"] != "127.0.0.1"
    # Group ranks follow the sorted node descriptors (addr string, pid): host 0 is first.
    rank0 = next(h for h in net.hosts if h.name == seen[0]["hostname"])
    assert rank0.addr == seen[0]["master_addr"] == net.hosts[0].addr
