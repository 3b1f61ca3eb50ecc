"""What keeps ``amptrain api`` answering when clients hold connections without finishing a
request: uvicorn's own HTTP protocol with a read deadline, a bound on header bytes and a
cap on the process's connections.

uvicorn 0.54 (its httptools and h11 protocols alike) has no timeout while a request is
still arriving: its keep-alive timer is armed only after a response, the first byte of the
next request cancels it, and nothing is armed when a connection opens. Measured (issue 25):
21,000 connections that sent ``GET /healthz HTTP/1.1`` and one header and then nothing were
all held (one still after 70 s) while other clients' requests went unanswered.
``limit_concurrency`` cannot help: it is checked once a request's headers are complete and
counts the half-open connections, so while they last it answers every real client 503. So
:func:`guarded` derives a protocol class that gives each connection

- a deadline, from its opening or the first byte after a response, for its whole request
  (headers and body) to arrive: past it the client gets ``408`` and the connection closes;
- :data:`MAX_HEADER_BYTES` before its headers are complete (httptools keeps every header
  in memory, unbounded): ``431`` and closed;
- a place under the process's cap (WebSockets count too): a connection opened over the cap
  closes the one that has waited longest for its next request, or, when every connection
  is busy with a request, is answered ``503`` at once;
- a place under the cap per client address: past it ``503`` and closed at once;
- a write deadline: asyncio pauses writes while over 64 KiB wait in a transport and uvicorn
  awaits the drain with no timeout, so clients that asked for big responses and never read
  held every place "busy", 1.5 MiB each, for ever (issue 37). Paused writes must resume
  within the deadline, else the connection is reset (WebSockets too: :func:`guarded_ws`).

Each kind of closing is logged at once, then summed up at most every
:data:`LOG_EVERY_S`, so a flood is visible in the log without flooding it. Behind a proxy
every connection comes from its address: there the per-address cap is off and the proxy
limits per client (``deploy/nginx.conf``), along with request rates and TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 * 1024
"""Bytes a request may send before its headers are complete (browsers send 1-8 KiB; h11's
own default limit is 16 KiB)."""
LOG_EVERY_S = 10.0
RESERVED_FDS = 384
"""Descriptors the API needs besides client connections: up to 256 pooled Redis connections
of the live hub, the database pool, the broker, log files and the event loop's own."""

_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_503 = b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


@dataclass
class _Tally:
    """One kind of closing: logged at once, then summed up every :data:`LOG_EVERY_S`."""

    message: str
    count: int = 0
    last_peer: str = "?"
    logged_at: float = -LOG_EVERY_S
    flush: asyncio.TimerHandle | None = None

    def note(self, peer: str) -> None:
        self.count += 1
        self.last_peer = peer
        now = time.monotonic()
        if now - self.logged_at >= LOG_EVERY_S:
            self._log(now)
        elif self.flush is None:
            loop = asyncio.get_running_loop()
            self.flush = loop.call_later(self.logged_at + LOG_EVERY_S - now, self._flushed)

    def _flushed(self) -> None:
        self.flush = None
        if self.count:
            self._log(time.monotonic())

    def _log(self, now: float) -> None:
        log.warning(self.message, self.count, self.last_peer)
        self.count, self.logged_at = 0, now


@dataclass
class ConnectionGuard:
    """The limits one API process enforces, and the connections waiting for a request in
    the order they started waiting (the oldest is closed first to admit a new one)."""

    max_connections: int
    read_timeout_s: float
    write_timeout_s: float = 30.0
    per_address: int = 0  # connections one client address may hold; 0: no limit
    addresses: dict[Any, str] = field(default_factory=dict)
    """Each open transport's client address (a WebSocket takes over its HTTP's transport)."""
    held: dict[str, int] = field(default_factory=dict)
    """Open connections per client address (only those in :attr:`addresses`)."""
    waiting: dict[Any, None] = field(default_factory=dict)
    closing: set[Any] = field(default_factory=set)
    """Connections closed here whose ``connection_lost`` has not come yet (still counted in
    uvicorn's set): without them a burst would close more connections than it needs."""
    timed_out: _Tally = field(init=False)
    oversized: _Tally = field(init=False)
    evicted: _Tally = field(init=False)
    refused: _Tally = field(init=False)
    crowded: _Tally = field(init=False)
    stalled: _Tally = field(init=False)

    def __post_init__(self) -> None:
        cap = self.max_connections
        self.timed_out = _Tally(
            f"closed %d connection(s) that did not send a complete request within "
            f"{self.read_timeout_s:g}s (408; the last from %s)"
        )
        self.oversized = _Tally(
            f"closed %d connection(s) whose request headers passed {MAX_HEADER_BYTES} bytes "
            "(431; the last from %s)"
        )
        self.evicted = _Tally(
            f"connection limit {cap} reached: closed %d connection(s) that waited longest "
            "for a request, to admit new ones (the last from %s)"
        )
        self.refused = _Tally(
            f"connection limit {cap} reached with every connection busy: refused %d new "
            "connection(s) with 503 (the last from %s)"
        )
        self.crowded = _Tally(
            f"{self.per_address} connections from one address reached: refused %d new "
            "connection(s) with 503 (the last from %s)"
        )
        self.stalled = _Tally(
            f"closed %d connection(s) that did not read their responses (writes paused for "
            f"{self.write_timeout_s:g}s; the last from %s)"
        )

    def admit(self, transport: Any, client: tuple[str, int] | None) -> bool:
        """Count ``transport`` under its client's address; False (uncounted) past the cap."""
        if not self.per_address or not client:
            return True
        address = client[0]
        if self.held.get(address, 0) >= self.per_address:
            return False
        self.held[address] = self.held.get(address, 0) + 1
        self.addresses[transport] = address
        return True

    def release(self, transport: Any) -> None:
        address = self.addresses.pop(transport, None)
        if address is not None:
            left = self.held[address] - 1
            if left:
                self.held[address] = left
            else:
                del self.held[address]

    def over_cap(self, connections: set[Any]) -> bool:
        return len(connections) - len(self.closing) > self.max_connections

    def oldest_waiting(self, other_than: Any) -> Any | None:
        for conn in self.waiting:
            if conn is not other_than:
                return conn
        return None

    def close(self, conn: Any, response: bytes | None) -> None:
        """Answer ``response`` (if any) on ``conn`` and close it."""
        transport = conn.transport
        self.waiting.pop(conn, None)
        if transport.is_closing():
            # Closed already (keep-alive timeout), yet close() waits for an unread rest.
            if transport.get_write_buffer_size():
                self.closing.add(conn)
                reset(transport)
            return
        self.closing.add(conn)
        if response is not None:
            transport.write(response)
        transport.close()


class _WriteDeadline:
    """One connection's write deadline: armed when asyncio pauses its writes, disarmed when
    they resume; on expiry the transport is aborted (its buffered responses dropped)."""

    def __init__(self, guard: ConnectionGuard, conn: Any) -> None:
        self.guard, self.conn = guard, conn
        self.timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        if self.timer is None:
            loop = asyncio.get_running_loop()
            self.timer = loop.call_later(self.guard.write_timeout_s, self._expired)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        conn, guard = self.conn, self.guard
        if conn.transport.get_protocol() is not conn:  # upgraded: the WebSocket's own now
            return
        guard.stalled.note(_peer(conn))
        guard.waiting.pop(conn, None)
        guard.closing.add(conn)
        reset(conn.transport)


class _Paced(asyncio.Protocol):
    """Writes paused by asyncio arm the connection's write deadline, resumed disarm it (the
    HTTP and the WebSocket protocol alike; each makes its ``_write`` when connected)."""

    _write: _WriteDeadline

    def pause_writing(self) -> None:
        super().pause_writing()
        self._write.arm()

    def resume_writing(self) -> None:
        self._write.disarm()
        super().resume_writing()


def reset(transport: Any) -> None:
    """Close ``transport`` at once, dropping what its client did not read: SO_LINGER 0, or
    the kernel keeps the socket and its buffers (an orphan) for minutes after an abort."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def guarded(base: type[asyncio.Protocol], guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """``base`` (uvicorn's ``HttpToolsProtocol`` or ``H11Protocol``) with ``guard``'s limits.

    Relies on what both share: ``connection_made``/``data_received``/``connection_lost``,
    ``on_response_complete``, ``server_state.connections``, ``transport``, ``client`` and
    the current ``cycle`` (``response_complete``, ``more_body``).
    """

    class Guarded(_Paced, base):  # type: ignore[valid-type, misc]
        _deadline: asyncio.TimerHandle | None = None
        _header_bytes = 0

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._write = _WriteDeadline(guard, self)
            if not guard.admit(transport, self.client):
                guard.crowded.note(_peer(self))
                guard.close(self, _503)
                return
            if guard.over_cap(self.server_state.connections):
                victim = guard.oldest_waiting(self)
                if victim is None:
                    guard.refused.note(_peer(self))
                    guard.close(self, _503)
                    return
                guard.evicted.note(_peer(victim))
                # Half a request sent: tell it to retry; an idle keep-alive just closes.
                guard.close(victim, _503 if victim._header_bytes else None)
            self._wait()
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and not self._started():
                self._arm()  # the first byte after a response: uvicorn just disarmed its own
            super().data_received(data)
            if self.transport.is_closing():
                return
            if self.transport.get_protocol() is not self:  # upgraded to a WebSocket
                self._busy()
                self._disarm()
                self._write.disarm()
                return
            if self._started():
                self._busy()
                if not self.cycle.more_body:
                    self._disarm()
                return
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES:
                guard.oversized.note(_peer(self))
                guard.close(self, _431)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self._started():
                self._wait()  # idle between requests: uvicorn's keep-alive timer runs

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._write.disarm()
            guard.release(self.transport)
            guard.waiting.pop(self, None)
            guard.closing.discard(self)
            super().connection_lost(exc)

        # -- state ------------------------------------------------------------------

        def _started(self) -> bool:
            """The app is handling a request of this connection (its headers are in)."""
            cycle = self.cycle
            return cycle is not None and not cycle.response_complete

        def _wait(self) -> None:
            self._header_bytes = 0
            guard.waiting.pop(self, None)
            guard.waiting[self] = None  # newest last

        def _busy(self) -> None:
            guard.waiting.pop(self, None)
            self._header_bytes = 0

        def _arm(self) -> None:
            self._disarm()
            self._deadline = asyncio.get_running_loop().call_later(
                guard.read_timeout_s, self._expired
            )

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            guard.timed_out.note(_peer(self))
            # Mid-body the app may already be answering: then no 408, just the close.
            guard.close(self, None if self._started() else _408)

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def guarded_ws(base: type[asyncio.Protocol], guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """``base`` (uvicorn's WebSocket protocol, which takes over :func:`guarded`'s transport)
    with the write deadline; it gives back the transport's place under the per-address cap."""

    class GuardedWS(_Paced, base):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._write = _WriteDeadline(guard, self)

        def connection_lost(self, exc: Exception | None) -> None:
            self._write.disarm()
            guard.release(self.transport)
            guard.closing.discard(self)
            super().connection_lost(exc)

    GuardedWS.__name__ = GuardedWS.__qualname__ = f"Guarded{base.__name__}"
    return GuardedWS


def _peer(conn: Any) -> str:
    client = getattr(conn, "client", None)
    return f"{client[0]}:{client[1]}" if client else "?"


def descriptor_plan(wanted: int, soft: int, hard: int) -> tuple[int, int]:
    """``(soft limit on open files to set, connection cap)`` for ``wanted`` connections: the
    soft limit raised as far as the hard one allows to hold them plus :data:`RESERVED_FDS`,
    the cap lowered (to at least 16) when even that is too few."""
    needed = wanted + RESERVED_FDS
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft, wanted
    raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    return max(soft, raised), min(wanted, max(16, max(soft, raised) - RESERVED_FDS))


def fit_descriptors(wanted: int) -> int:
    """The connection cap this process can hold (see :func:`descriptor_plan`), after
    raising its soft limit on open files; a warning names both numbers when it is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target, cap = descriptor_plan(wanted, soft, hard)
    if target != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if cap < wanted:
        log.warning(
            "AMPTRAIN_MAX_CONNECTIONS=%d needs %d open files but this process may open %d "
            "(ulimit -n): at most %d connections",
            wanted,
            wanted + RESERVED_FDS,
            target,
            cap,
        )
    return cap
