"""Several hosts on one machine: Linux network namespaces joined by a bridge (needs root).

Why: multi-node training must keep all its traffic on the hosts' own addresses. On one
machine every process shares ``127.0.0.1`` and one hostname, so a launcher that
advertises ``localhost`` (or a hostname that resolves to it) still works there and fails
on real hosts. Here each host has its own address, its own hostname and its own
``/etc/hosts``, and can reach the others only through those addresses.

What :class:`Network` creates, every name carrying this process's pid (parallel
pytest-xdist workers never collide; interface names stay within Linux's 15 characters):

- a bridge ``atb<pid>x<k>`` in the root namespace with ``10.X.Y.1/24``, the subnet
  picked from the pid and skipping any subnet already on this machine: its address
  (:attr:`Network.bridge_addr`) is where the test's own servers listen for the hosts
  (:meth:`Network.start_redis`);
- per host ``i`` a namespace (the host's name and hostname), ``lo`` up, and a veth pair:
  ``atv<pid>x<k>h<i>`` on the bridge, ``eth0`` inside with ``10.X.Y.(i+2)/24``;
- ``/etc/netns/<name>/hosts`` (``ip netns exec`` mounts it over ``/etc/hosts``): every
  host's name and address, so a hostname resolves as on a real cluster.

:meth:`Host.popen` runs a command in a host (``ip netns exec``, plus its own UTS
namespace so ``socket.gethostname()`` is the host's name). :meth:`Host.cut` sets the
host's cable down (its bridge end: nothing goes in or out), :meth:`Host.restore` plugs it
back. :meth:`Network.close` (also on leaving ``with``, and the ``netns_hosts`` fixture
always calls it) kills every process inside the namespaces (found by ``ip netns pids``,
so a launcher's children too), stops the Redis servers it started and deletes the veths,
the bridge, the namespaces and their ``/etc/netns`` files. A run killed with SIGKILL
leaves them behind (``ip netns list``; names carry the dead run's pid).

Where it cannot run (not root, no ``ip netns``), :func:`netns_unavailable` says why: the
fixture skips, except under ``CI`` (CI runs as root, so there it fails instead).
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core.lifeline import DieWithSpawner
from tests.support.stack import wait_until

IFNAME = "eth0"
"""Each host's interface, the same name in every host (as ``GLOO_SOCKET_IFNAME`` wants)."""

_networks = itertools.count()


def ip(*args: str, check: bool = True) -> str:
    """``ip ARGS`` in the root namespace; its stdout (raises with stderr when it fails)."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "iproute2's `ip` and util-linux's `unshare` are needed"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode:
        return "`ip netns` is not available"
    return None


class Host:
    """One host: a network namespace with its own address and hostname."""

    def __init__(self, name: str, addr: str, veth: str) -> None:
        self.name = name
        self.addr = addr
        self.veth = veth  # its bridge end, in the root namespace
        self.processes: list[subprocess.Popen[Any]] = []

    def __repr__(self) -> str:
        return f"Host({self.name}, {self.addr})"

    def popen(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, **kw: Any
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside this host (``env`` replaces the environment, as Popen's does;
        ``kw`` go to Popen). It dies with the calling process and is killed on close."""
        inside = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', self.name]
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.name, *inside, *argv],
            env=None if env is None else dict(env),
            preexec_fn=DieWithSpawner(),
            **kw,
        )
        self.processes.append(process)
        return process

    def run(
        self, argv: Sequence[str], timeout: float = 30, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside this host to its end; its output as text."""
        process = self.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
        out, err = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def cut(self) -> None:
        """Pull the cable: the host's link goes down, no traffic in or out."""
        ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        """Plug the cable back in (and wait until the link carries traffic)."""
        ip("link", "set", self.veth, "up")
        self._wait_up()

    def _wait_up(self) -> None:
        def up() -> bool:
            state = ip("-n", self.name, "-o", "link", "show", IFNAME)
            return "LOWER_UP" in state and "NO-CARRIER" not in state

        wait_until(up, 10, f"{self.name}'s link up", interval=0.01)

    def kill_all(self) -> None:
        """SIGKILL every process in the namespace (a launcher's children included)."""

        def gone() -> bool:
            pids = ip("netns", "pids", self.name, check=False).split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            for process in self.processes:
                if process.poll() is None:
                    return False
            return not pids

        wait_until(gone, 20, f"the processes in {self.name} to end", interval=0.02)


class Network:
    """A bridge and ``n`` hosts on it; see the module's docstring."""

    def __init__(self, n: int) -> None:
        if not 1 <= n <= 99:
            raise ValueError("1 to 99 hosts")
        self.tag = f"{os.getpid():x}x{next(_networks)}"
        self.bridge = f"atb{self.tag}"
        self.hosts: list[Host] = []
        self.redis_servers: list[EmbeddedRedis] = []
        self._etc: list[Path] = []
        self.subnet = _free_subnet(os.getpid())
        self.bridge_addr = str(self.subnet.network_address + 1)
        try:
            self._create(n)
        except BaseException:
            self.close()
            raise

    def _create(self, n: int) -> None:
        ip("link", "add", self.bridge, "type", "bridge", "forward_delay", "0")
        ip("addr", "add", f"{self.bridge_addr}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i in range(n):
            name, veth = f"at{self.tag}h{i}", f"atv{self.tag}h{i}"
            assert len(veth) <= 15, veth
            self.hosts.append(Host(name, str(self.subnet.network_address + 2 + i), veth))
        for host in self.hosts:
            ip("netns", "add", host.name)
            ip("link", "add", host.veth, "type", "veth", "peer", "name", f"{host.veth}p")
            ip("link", "set", f"{host.veth}p", "netns", host.name)
            ip("-n", host.name, "link", "set", f"{host.veth}p", "name", IFNAME)
            ip("-n", host.name, "addr", "add", f"{host.addr}/24", "dev", IFNAME)
            ip("-n", host.name, "link", "set", "lo", "up")
            ip("-n", host.name, "link", "set", IFNAME, "up")
            ip("link", "set", host.veth, "master", self.bridge)
            ip("link", "set", host.veth, "up")
            etc = Path("/etc/netns") / host.name
            etc.mkdir(parents=True)
            self._etc.append(etc)
            names = "".join(f"{h.addr} {h.name}\n" for h in self.hosts)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
        for host in self.hosts:
            host._wait_up()

    def start_redis(self) -> EmbeddedRedis:
        """A private redis-server on the bridge address (hosts reach it at its ``tcp_url``)
        and 127.0.0.1 on a free port, and on its unix socket (``url``); stopped on close."""
        for _ in range(5):  # a free port can be taken before redis binds it: try another
            directory = Path(tempfile.mkdtemp(prefix="amp-", dir="/tmp"))
            bind = (self.bridge_addr, "127.0.0.1")
            server = EmbeddedRedis(directory, appendonly=False, bind=bind, port=_free_port())
            try:
                server.start()
            except RuntimeError:
                continue
            self.redis_servers.append(server)
            return server
        raise RuntimeError(f"redis-server did not start on {self.bridge_addr}")

    def close(self) -> None:
        """Kill the hosts' processes, stop the servers, delete everything created."""
        for host in self.hosts:
            if host.name in ip("netns", "list", check=False).split():
                host.kill_all()
        for server in self.redis_servers:
            server.stop()
        for host in self.hosts:
            ip("link", "del", host.veth, check=False)  # deletes both ends
        ip("link", "del", self.bridge, check=False)
        for host in self.hosts:
            ip("netns", "del", host.name, check=False)
        for etc in self._etc:
            shutil.rmtree(etc, ignore_errors=True)
        self.redis_servers, self._etc = [], []

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def networks() -> Iterator[Callable[[int], Network]]:
    """``make(n)``: a new network of ``n`` hosts; all of them closed on leaving."""
    made: list[Network] = []

    def make(n: int) -> Network:
        made.append(Network(n))
        return made[-1]

    try:
        yield make
    finally:
        for network in reversed(made):
            network.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def _free_subnet(seed: int) -> ipaddress.IPv4Network:
    """A /24 in 10.64.0.0/10 that no interface of this machine is on, starting from ``seed``
    (the pid), so that parallel test processes pick different ones."""
    used = set()
    for line in ip("-4", "-o", "addr", "show").splitlines():
        for word in line.split():
            if "/" in word and word[0].isdigit():
                used.add(ipaddress.ip_interface(word).network.network_address.packed[:3])
    for k in range(1 << 14):
        index = (seed + k) % (1 << 14)
        net = ipaddress.IPv4Network((0x0A400000 + (index << 8), 24))
        if net.network_address.packed[:3] not in used:
            return net
    raise RuntimeError("no free /24 in 10.64.0.0/10")
