"""Half-open connections cannot starve the API: a real uvicorn (``amptrain api``) with a
file-descriptor limit below the flood, half-open connections from eight loopback addresses,
and another client whose requests must keep succeeding meanwhile.

A half-open connection sends ``GET /healthz HTTP/1.1\\r\\nHost: x\\r\\n`` and then nothing
(the probe in issue 25 held 21,000 of them open). Before the connection guard every one was
held: with the API's descriptors used up it stopped accepting, and other clients' requests
hung. Bounded to run in seconds on two cores: 600 connections against a cap of 100 and a
2 s read timeout.
"""

from __future__ import annotations

import selectors
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.server.web.test_http import cpu_job
from tests.support.stack import Stack

pytestmark = pytest.mark.slow  # a real API per test; each runs on one database

NOFILE = 512
"""The API's descriptor limit (``ulimit -n``): below the flood, so without a cap it runs out."""
CAP = 100
READ_TIMEOUT_S = 2
FLOOD = 600
ADDRESSES = [f"127.0.0.{i}" for i in range(2, 10)]
LATENCY_S = 1.0
"""Each of the other client's requests (a fresh connection every time) must be answered
within this, during the flood (unloaded it takes about 10 ms)."""
HALF_OPEN = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
ENV = {
    "AMPTRAIN_MAX_CONNECTIONS": str(CAP),
    "AMPTRAIN_REQUEST_READ_TIMEOUT_SECONDS": str(READ_TIMEOUT_S),
    "AMPTRAIN_RECORDER_IN_API": "false",  # fewer threads and descriptors of its own
    "AMPTRAIN_LIVE_HEARTBEAT_SECONDS": "0.5",
}


class LimitedStack(Stack):
    """The API started under ``ulimit -n NOFILE``."""

    def entry(self, name: str) -> list[str]:
        return [
            "sh",
            "-c",
            f'ulimit -n {NOFILE} && exec "$0" "$@"',
            sys.executable,
            "-m",
            "amptrain.cli.main",
        ]


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = LimitedStack(tmp_path, database_url, redis_server)
    s.env.update(ENV)
    s.start_api()
    yield s
    s.close()


def half_open(port: int, source: str) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    sock.sendall(HALF_OPEN)
    return sock


def closed_by_server(socks: list[socket.socket], within_s: float) -> int:
    """How many of ``socks`` the server closed (EOF or reset, after any answer) by the
    deadline: waits on the sockets themselves, returns as soon as all are closed."""
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    closed = 0
    deadline = time.monotonic() + within_s
    while closed < len(socks) and (left := deadline - time.monotonic()) > 0:
        for key, _ in sel.select(left):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)  # an answer (408), then EOF
            except BlockingIOError:
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                sel.unregister(sock)
                closed += 1
    sel.close()
    return closed


def test_half_open_connections_neither_starve_others_nor_stay_open(stack: Stack) -> None:
    job = stack.submit(cpu_job())
    fresh = httpx.Limits(max_keepalive_connections=0)  # a new connection for every request
    client = httpx.Client(
        base_url=str(stack.client.base_url),
        headers=stack.client.headers,
        limits=fresh,
        timeout=5,
    )
    flood: list[socket.socket] = []
    latencies: list[float] = []
    failures: list[str] = []
    try:
        # Interleaved, so every request of the other client meets a growing flood.
        for round_ in range(20):
            for i in range(FLOOD // 20):
                n = round_ * (FLOOD // 20) + i
                flood.append(half_open(stack.port, ADDRESSES[n % len(ADDRESSES)]))
            started = time.monotonic()
            try:
                r = client.get(f"/jobs/{job['id']}")
                latencies.append(time.monotonic() - started)
                if r.status_code != 200:
                    failures.append(f"round {round_}: {r.status_code} {r.text[:80]}")
            except httpx.HTTPError as exc:
                failures.append(f"round {round_}: {type(exc).__name__} {exc}")
        assert not failures, failures
        assert max(latencies) < LATENCY_S, sorted(latencies)[-5:]
        # Every half-open connection is closed by the server: the older ones to admit newer
        # ones (the cap), the last hundred once the read timeout passed.
        assert closed_by_server(flood, READ_TIMEOUT_S + 5) == len(flood)
    finally:
        client.close()
        for s in flood:
            s.close()
    log = (stack.root / "api.log").read_text()
    assert f"connection limit {CAP} reached" in log, stack.log_tail("api")
    assert f"not send a complete request within {READ_TIMEOUT_S:g}s" in log, stack.log_tail("api")


def answer_and_close(sock: socket.socket, within_s: float) -> bytes:
    """Everything the server sends on ``sock`` until it closes it (fails after ``within_s``)."""
    sock.settimeout(within_s)
    got = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return got
        if not data:
            return got
        got += data


def test_stalled_requests_of_every_kind_are_closed_and_watchers_are_not(stack: Stack) -> None:
    from websockets.sync.client import connect

    job = stack.submit(cpu_job())
    addr = ("127.0.0.1", stack.port)
    slack = READ_TIMEOUT_S + 5
    # A keep-alive connection: one request answered, the next one started and stalled.
    with socket.create_connection(addr) as kept:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        kept.settimeout(5)
        first = b""
        while not first.endswith(b'{"status":"ok"}'):  # the whole response, body included
            data = kept.recv(65536)
            assert data, first
            first += data
        assert first.startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert answer_and_close(kept, slack).startswith(b"HTTP/1.1 408")
    # A body that stops halfway is cut off too (no answer: the app may be reading it).
    with socket.create_connection(addr) as body:
        body.sendall(
            f"POST /jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {stack.token}\r\n"
            'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"name"'.encode()
        )
        answer_and_close(body, slack)
    # Headers past 64 KiB: 431 at once, before the request is complete.
    with socket.create_connection(addr) as big:
        big.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (70 * 1024))
        assert answer_and_close(big, 5).startswith(b"HTTP/1.1 431")
    # A live watcher outlives the read timeout: its request was complete long ago.
    url = f"ws://127.0.0.1:{stack.port}/jobs/{job['id']}/ws"
    with connect(url, subprotocols=["bearer", stack.token]) as ws:  # type: ignore[list-item]
        until = time.monotonic() + READ_TIMEOUT_S * 2
        while time.monotonic() < until:
            assert ws.recv(timeout=5)  # heartbeats every 0.5 s, then still open
