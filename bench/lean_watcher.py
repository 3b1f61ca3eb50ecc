"""A WebSocket watcher that costs its machine as little as Python allows, for benchmarks
that run hundreds of watchers on the same two cores as the server they measure.

``websockets.connect`` spends ~80 µs of client CPU per frame (its reader task, queue and
async iterator); here one asyncio protocol feeds websockets' sans-I/O client directly
and hands each text message to a callback, stamped with its arrival time. The frames are
parsed by the same library, so what arrives is what any client would see.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

OnMessage = Callable[[bytes, float], bool]
"""Called with a text message and its arrival time; returns True to hang up."""


class _Watcher(asyncio.Protocol):
    def __init__(self, url: str, token: str, on_message: OnMessage) -> None:
        self.ws = ClientProtocol(parse_uri(url), max_size=None)
        self.token = token
        self.on_message = on_message
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        request = self.ws.connect()
        request.headers["Authorization"] = f"Bearer {self.token}"
        self.ws.send_request(request)
        self._flush()

    def data_received(self, data: bytes) -> None:
        now = time.time()
        self.ws.receive_data(data)
        for event in self.ws.events_received():
            if isinstance(event, Response):
                if self.ws.handshake_exc is not None:
                    self._fail(self.ws.handshake_exc)
                    return
                if not self.opened.done():
                    self.opened.set_result(None)
            elif (
                isinstance(event, Frame)
                and event.opcode is Opcode.TEXT
                and self.on_message(bytes(event.data), now)
            ):
                self._hang_up()
                return
        self._flush()
        if self.ws.close_expected() and self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(exc or ConnectionError("closed during the handshake"))
        if not self.closed.done():
            self.closed.set_result(None)

    def _flush(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            for chunk in self.ws.data_to_send():
                if chunk:
                    self.transport.write(chunk)

    def _hang_up(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: BaseException) -> None:
        if not self.opened.done():
            self.opened.set_exception(exc)
        self._hang_up()


async def watch(url: str, token: str, on_message: OnMessage) -> None:
    """Follow ``url`` (``ws://host:port/...``) until ``on_message`` says so or the server
    closes; raises if the handshake fails."""
    uri = parse_uri(url)  # port defaulted (80, 443) like any client would
    loop = asyncio.get_running_loop()
    _, watcher = await loop.create_connection(
        lambda: _Watcher(url, token, on_message), uri.host, uri.port
    )
    await asyncio.wait_for(asyncio.shield(watcher.opened), 60)
    await watcher.closed
