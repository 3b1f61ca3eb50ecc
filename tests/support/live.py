"""Clients for the live endpoints in tests: WebSocket watchers, an SSE reader, a raw stalled
socket, and a run that backs one up while two others keep up."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

import websockets

from tests.support.producer import Producer
from tests.support.stack import Stack

Message = dict[str, Any]


def ws_url(stack: Stack, job_id: str, after: str | None = None, batch: bool = False) -> str:
    params = [f"after={after}"] if after else []
    if batch:
        params.append("batch=true")
    query = f"?{'&'.join(params)}" if params else ""
    return f"ws://127.0.0.1:{stack.port}/jobs/{job_id}/ws{query}"


async def watch(
    stack: Stack,
    job_id: str,
    after: str | None = None,
    until: Callable[[Message], bool] | None = None,
    token: str | None = None,
    batch: bool = False,
) -> tuple[list[Message], int | None]:
    """Read messages until the server closes (or ``until`` says stop); (messages, close code).
    ``batch``: ask for batch frames (returned as they came; :func:`records` opens them)."""
    headers = {"Authorization": f"Bearer {token or stack.token}"}
    got: list[Message] = []
    async with websockets.connect(
        ws_url(stack, job_id, after, batch), additional_headers=headers, open_timeout=30
    ) as ws:
        async for raw in ws:
            msg = json.loads(raw)
            got.append(msg)
            if until is not None and until(msg):
                return got, None
        return got, ws.close_code


def records(messages: list[Message]) -> list[Message]:
    """The messages with every ``batch`` frame replaced by its items."""
    out: list[Message] = []
    for m in messages:
        out.extend(m["items"] if m["type"] == "batch" else [m])
    return out


def steps_of(messages: list[Message]) -> list[int]:
    return [m["data"]["step"] for m in records(messages) if m["type"] == "metric"]


def last_cursor(messages: list[Message]) -> str | None:
    cursors = [m["cursor"] for m in messages if m["cursor"]]
    return cursors[-1] if cursors else None


def read_sse(
    stack: Stack,
    job_id: str,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    stop_at_step: int | None = None,
) -> tuple[list[Message], str | None]:
    """SSE ``GET /jobs/{id}/stream``: (messages, the last ``id:`` seen) until the stream ends
    or a message holds ``stop_at_step``. Each event is named for its message's type, and
    every record or batch carries an ``id:``, its cursor."""
    got: list[Message] = []
    last_id = None
    frame: dict[str, str] = {}
    path = f"/jobs/{job_id}/stream"
    with stack.client.stream("GET", path, params=params, headers=headers) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line:
                name, _, value = line.partition(": ")
                frame[name] = value
                continue
            msg = json.loads(frame["data"])
            assert msg["type"] == frame["event"]
            if "id" in frame or msg["type"] in ("metric", "eval", "event", "batch"):
                assert frame["id"] == msg["cursor"]
                last_id = frame["id"]
            got.append(msg)
            frame = {}
            if stop_at_step is not None and stop_at_step in steps_of([msg]):
                break
    return got, last_id


class StalledSocket:
    """A WebSocket client that completes the handshake and then reads nothing, with a tiny
    receive buffer so the server's send path backs up quickly."""

    def __init__(self, stack: Stack, job_id: str, batch: bool = False) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", stack.port))
        key = base64.b64encode(os.urandom(16)).decode()
        path = f"/jobs/{job_id}/ws" + ("?batch=true" if batch else "")
        request = (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {stack.token}\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.sock.recv(4096)
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head

    def drain(self, timeout: float) -> tuple[list[Message], int | None]:
        """Now read everything: (messages, close code or None if the peer just hung up)."""
        self.sock.settimeout(timeout)
        while True:
            try:
                chunk = self.sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            self.buffer += chunk
        self.sock.close()
        return parse_frames(self.buffer)


def parse_frames(data: bytes) -> tuple[list[Message], int | None]:
    """Unmasked server frames -> (text messages as JSON, close code)."""
    out: list[Message] = []
    i = 0
    while i + 2 <= len(data):
        opcode, length = data[i] & 0x0F, data[i + 1] & 0x7F
        i += 2
        if length == 126:
            (length,) = struct.unpack("!H", data[i : i + 2])
            i += 2
        elif length == 127:
            (length,) = struct.unpack("!Q", data[i : i + 8])
            i += 8
        if i + length > len(data):
            break  # cut off mid-frame
        payload = data[i : i + length]
        i += length
        if opcode == 1:
            out.append(json.loads(payload))
        elif opcode == 8:
            return out, struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
    return out, None


def stall_one_of_three(
    stack: Stack, producer: Producer, total: int, batch: bool = False
) -> tuple[list[tuple[list[Message], int | None]], list[Message], int | None]:
    """Three watchers of ``producer``'s job while it writes ``total`` steps in bursts of 100:
    what each of the two healthy ones got (messages, close code), then what the one that
    stalled (a :class:`StalledSocket`, drained at the end) got and its close code."""
    producer.start()
    stalled = StalledSocket(stack, producer.job_id, batch=batch)

    async def scenario() -> list[tuple[list[Message], int | None]]:
        healthy = [
            asyncio.create_task(watch(stack, producer.job_id, batch=batch)) for _ in range(2)
        ]
        await asyncio.sleep(0.3)
        # Loopback's kernel buffers absorb a few MB before the server's send blocks.
        for first in range(1, total, 100):
            producer.steps(first, first + 99)
            await asyncio.sleep(0.02)
        producer.finish(step=total)
        return list(await asyncio.gather(*healthy))

    healthy = asyncio.run(scenario())
    seen, code = stalled.drain(timeout=10)
    return healthy, seen, code
