"""Clients that do not read their responses, or come many from one address, cannot take the
API's every connection: a real uvicorn (``amptrain api``) with a small cap, a 2 s write
deadline and a per-address cap.

Issue 37: 70 connections with a 1 KiB receive buffer, each sending two pipelined ``GET`` of
the 1.5 MiB Swagger bundle and never reading, held all 64 places of the cap "busy" (uvicorn
awaits the drain with no timeout): other clients' ``/healthz`` got 503 for as long as they
stayed, 1.5 MiB of unsent data each.
"""

from __future__ import annotations

import base64
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.server.web.app import DOCS_ASSETS
from tests.server.web.dashboard.test_dashboard import bulk_points
from tests.server.web.test_half_open import answer_and_close
from tests.server.web.test_http import cpu_job
from tests.support.stack import Stack

pytestmark = pytest.mark.slow  # a real API per test

CAP = 16  # the least AMPTRAIN_MAX_CONNECTIONS allows
PER_ADDRESS = 6
WRITE_TIMEOUT_S = 2
SLACK_S = 20.0
"""Bounds on what the server must have done by then: generous, for a loaded machine."""
ENV = {
    "AMPTRAIN_MAX_CONNECTIONS": str(CAP),
    "AMPTRAIN_MAX_CONNECTIONS_PER_ADDRESS": str(PER_ADDRESS),
    "AMPTRAIN_RESPONSE_WRITE_TIMEOUT_SECONDS": str(WRITE_TIMEOUT_S),
    "AMPTRAIN_REQUEST_READ_TIMEOUT_SECONDS": "30",  # idle connections stay for the test
    "AMPTRAIN_RECORDER_IN_API": "false",
}
BUNDLE = f"GET {DOCS_ASSETS}/swagger-ui-bundle.js HTTP/1.1\r\nHost: x\r\n\r\n".encode()
ESTABLISHED = 1  # tcp_info.tcpi_state (Linux)
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.env.update(ENV)
    s.start_api()
    yield s
    s.close()


def slow_reader(port: int, source: str) -> socket.socket:
    """Two pipelined requests for the 1.5 MiB bundle through a 1 KiB receive buffer, never read."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    sock.sendall(BUNDLE * 2)
    return sock


def cut_off(socks: list[socket.socket], within_s: float) -> int:
    """How many of ``socks`` the server closed (reset or FIN) by the deadline, seen in each
    socket's TCP state without reading it (reading would make it a client that reads)."""
    deadline = time.monotonic() + within_s
    while True:
        closed = sum(
            s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != ESTABLISHED for s in socks
        )
        if closed == len(socks) or time.monotonic() > deadline:
            return closed
        time.sleep(0.1)


def healthz_from(port: int, source: str) -> int | None:
    """The status of ``/healthz`` on a fresh connection from ``source`` (None: closed unanswered)."""
    with socket.socket() as sock:
        sock.bind((source, 0))
        sock.settimeout(5)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head = answer_and_close(sock, 10)
    return int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else None


def test_clients_that_do_not_read_lose_their_connections(stack: Stack) -> None:
    sources = [f"127.0.0.{i}" for i in range(2, 6)]  # 4 addresses: 20 slow readers, 5 each
    slow = [slow_reader(stack.port, sources[n % len(sources)]) for n in range(CAP + 4)]
    try:
        statuses: list[int | None] = []
        deadline = time.monotonic() + SLACK_S
        while time.monotonic() < deadline:
            statuses.append(healthz_from(stack.port, "127.0.0.1"))
            if statuses[-1] == 200:
                break
            time.sleep(0.2)
        assert statuses[-1] == 200, f"/healthz answered {statuses} while slow readers held on"
        # Each slow reader is cut off (a reset: what it did not read is dropped).
        assert cut_off(slow, SLACK_S) == len(slow)
    finally:
        for s in slow:
            s.close()
    log = (stack.root / "api.log").read_text()
    assert "did not read their responses" in log, stack.log_tail("api")


def test_one_address_holds_at_most_its_share(stack: Stack) -> None:
    held: list[socket.socket] = []
    try:
        for _ in range(PER_ADDRESS):  # keep-alive connections, each answered once
            sock = socket.create_connection(
                ("127.0.0.1", stack.port), source_address=("127.0.0.2", 0)
            )
            held.append(sock)
            sock.sendall(HEALTHZ)
            sock.settimeout(10)
            got = b""
            while not got.endswith(b'{"status":"ok"}'):
                data = sock.recv(65536)
                assert data, got
                got += data
            assert got.startswith(b"HTTP/1.1 200"), got
        # One more from that address: 503 and closed; another address is still served.
        assert healthz_from(stack.port, "127.0.0.2") == 503
        assert healthz_from(stack.port, "127.0.0.3") == 200
        # A place freed is a place again.
        held.pop().close()
        statuses: list[int | None] = []
        deadline = time.monotonic() + SLACK_S
        while time.monotonic() < deadline:
            statuses.append(healthz_from(stack.port, "127.0.0.2"))
            if statuses[-1] == 200:
                break
            time.sleep(0.2)
        assert statuses[-1] == 200, statuses
    finally:
        for s in held:
            s.close()
    log = (stack.root / "api.log").read_text()
    assert f"{PER_ADDRESS} connections from one address reached" in log, stack.log_tail("api")


def test_a_watcher_that_does_not_read_loses_its_websocket(stack: Stack) -> None:
    if not stack.env["AMPTRAIN_DATABASE_URL"].startswith("sqlite:///"):
        pytest.skip("the history is written straight into the SQLite file")
    job = stack.submit(cpu_job())
    bulk_points(stack, job["id"], 20_000, spike=0)  # megabytes of history to send
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", stack.port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /jobs/{job['id']}/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Sec-WebSocket-Protocol: bearer, {stack.token}\r\n\r\n".encode()
    )
    try:
        # Never read: the history stalls in the server's buffers until the deadline cuts it.
        assert cut_off([sock], SLACK_S) == 1
    finally:
        sock.close()
    log = (stack.root / "api.log").read_text()
    assert "did not read their responses" in log, stack.log_tail("api")
