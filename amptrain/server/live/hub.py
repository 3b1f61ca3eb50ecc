"""The live hub: one Redis stream reader per watched job per API process, fanned out to
every WebSocket / SSE watcher of that job through bounded per-watcher queues.

A reader starts at the stream's current last entry (looked up with XREVRANGE, so no
entry added between "subscribe" and the first XREAD is missed, which ``$`` would
allow) and then follows ``XREAD BLOCK`` from the last id it delivered. Entries are
decoded once and shared by all watchers, and each XREAD's entries travel as one
:class:`LiveBatch`, where watchers at the same position share the batch frame encoded
from them (:mod:`amptrain.server.live.watch`). A watcher whose queue is full is cut off:
its subscription is marked overflowed and receives nothing more, so a slow client
never slows the reader, the other watchers or the worker; :mod:`amptrain.server.live.watch` turns
that into a ``gap`` message and the client resumes from its cursor.

Runs on the server's event loop (redis.asyncio with a BlockingConnectionPool; a
plain pool broke under 200 watchers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aioredis

from amptrain.contract.cursor import ORIGIN, Cursor
from amptrain.contract.stream import decode, text
from amptrain.core.redis import Keys, async_pool

log = logging.getLogger(__name__)

PACE_PER_WATCHER_S = 100e-6
"""How far apart a job's delivery rounds are, per watcher taking batch frames. Each round
costs every such watcher a socket write (~15 µs in the kernel on loopback plus ~30 µs of
Python), so rounds at least N x 100 µs apart keep one job's fan-out near half a core
whatever N is, up to :data:`PACE_MAX_S`; records that arrive meanwhile share the next
frame. Measured on 2 cores with 500 batch watchers (``bench/stream_latency.py``): p99
187 ms unpaced (the API saturated), 147 ms at 50 µs, 90 ms at 100 µs."""
PACE_MAX_S = 0.05
"""The most a record waits for its round: from 500 batch watchers on, 20 rounds a second."""


def gather_s(grouped: int) -> float:
    """How long a job's records gather between rounds with ``grouped`` batch watchers
    (:data:`PACE_PER_WATCHER_S`); 0 below 2 ms, where a timer would cost more than it saves."""
    gather = min(PACE_MAX_S, grouped * PACE_PER_WATCHER_S)
    return gather if gather >= 0.002 else 0.0


@dataclass(slots=True)
class LiveEntry:
    """One decoded stream entry, shared read-only by every watcher of the job; ``message``
    caches its encoded message (:class:`amptrain.server.live.messages.Out`) so 500 watchers
    cost one ``json.dumps``."""

    pos: Cursor
    item: dict[str, Any]
    message: Any = None


@dataclass(eq=False, slots=True)
class LiveBatch:
    """The entries one XREAD delivered, shared read-only by every watcher of the job.
    ``frames`` caches batch frames built from them, so the watchers that take the same
    entries share one encoded frame (keyed by :mod:`amptrain.server.live.watch`)."""

    entries: list[LiveEntry]
    frames: dict[str, str] = field(default_factory=dict)
    messages: list[Any] | None = None
    """The entries' messages (:class:`amptrain.server.live.messages.Out`), built once."""
    points: tuple[tuple[int, int], tuple[int, int]] | None = None
    """(first, last) (attempt, step) when the batch holds only metrics with growing points:
    a watcher already before the first takes all of ``messages`` without looking at each."""


@dataclass(eq=False)
class Subscription:
    """One watcher's bounded inbox. ``overflowed`` is set (and nothing more arrives) once
    the watcher fell ``maxsize`` entries behind."""

    job_id: str
    maxsize: int
    batches: deque[LiveBatch] = field(default_factory=deque)
    queued: int = 0
    """Entries in ``batches``."""
    grouped: bool = False
    """The watcher takes batch frames: its records may wait for the job's next round."""
    overflowed: bool = False
    on_overflow: Callable[[], object] | None = None
    _waiter: asyncio.Future[None] | None = None

    def offer(self, batch: LiveBatch) -> bool:
        """Queue a batch; False (and overflowed) when it does not fit."""
        if self.overflowed:
            return False
        if self.queued + len(batch.entries) > self.maxsize:
            self.overflowed = True
            self.batches.clear()  # nothing of it will be sent: free the memory now
            self.queued = 0
            self._wake()
            if self.on_overflow is not None:
                self.on_overflow()
            return False
        self.batches.append(batch)
        self.queued += len(batch.entries)
        self._wake()
        return True

    async def wait(self, timeout: float) -> None:
        """Return once entries are queued, the subscription overflowed, or ``timeout`` passed.

        A bare future and one timer handle, not an Event under ``asyncio.timeout``: it
        runs once per watcher per delivery round."""
        if self.batches or self.overflowed:
            return
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(timeout, self._wake)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def take(self) -> list[LiveBatch]:
        """Every queued batch, oldest first; the inbox is empty afterwards."""
        out = list(self.batches)
        self.batches.clear()
        self.queued = 0
        return out


class _Reader:
    """The single XREAD loop of one job in this process."""

    def __init__(self, hub: LiveHub, job_id: str, start: str) -> None:
        self.hub = hub
        self.job_id = job_id
        self.key = Keys.telemetry(job_id)
        self.last = start
        self.subs: set[Subscription] = set()
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        backoff = 0.2
        while self.subs:
            try:
                reply: Any = await self.hub.redis.xread(
                    {self.key: self.last}, count=self.hub.batch, block=self.hub.block_ms
                )
                backoff = 0.2
            except (redis.RedisError, OSError) as exc:
                log.warning("live reader for job %s: %s; retrying", self.job_id, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            for _key, raw in reply or []:
                if raw:
                    self._deliver(raw)
                    await self._pace()
        if self.hub.readers.get(self.job_id) is self:
            del self.hub.readers[self.job_id]

    async def _pace(self) -> None:
        """Let records gather before the next round when many watchers take batch frames;
        one or a few watchers get every record at once."""
        gather = gather_s(sum(1 for sub in self.subs if sub.grouped))
        if gather:
            await asyncio.sleep(gather)

    def _deliver(self, raw: list[tuple[Any, dict[Any, Any]]]) -> None:
        entries: list[LiveEntry] = []
        for eid, fields in raw:
            try:
                entries.append(LiveEntry(Cursor.of_entry(eid), decode(fields)))
            except (KeyError, ValueError):
                log.error("job %s: undecodable stream entry %r skipped", self.job_id, eid)
        self.last = text(raw[-1][0])
        if not entries:
            return
        batch = LiveBatch(entries)
        for sub in list(self.subs):
            if not sub.offer(batch):
                self.subs.discard(sub)
                self.hub.overflows += 1


class LiveHub:
    """Shared stream readers. ``async with hub.subscribe(job_id) as sub`` registers a
    watcher; every entry appended after registration reaches ``sub`` (or overflows it)."""

    def __init__(
        self,
        redis_url: str,
        *,
        queue_size: int = 4096,
        block_ms: int = 1000,
        batch: int = 500,
        max_connections: int = 256,
    ) -> None:
        self.queue_size = queue_size
        self.block_ms = block_ms
        self.batch = batch
        # A blocked XREAD holds its connection for block_ms: keep the socket timeout above it.
        timeout = block_ms / 1000 + 10
        self.pool = async_pool(redis_url, max_connections, timeout)
        self.redis = aioredis.Redis(connection_pool=self.pool)
        self.readers: dict[str, _Reader] = {}
        self.overflows = 0

    @contextlib.asynccontextmanager
    async def subscribe(self, job_id: str, *, grouped: bool = False) -> AsyncIterator[Subscription]:
        """Register a watcher for ``job_id``'s new stream entries while the block runs;
        ``grouped``: it takes batch frames (see :data:`PACE_PER_WATCHER_S`)."""
        sub = Subscription(job_id, self.queue_size, grouped=grouped)
        reader = self.readers.get(job_id)
        if reader is None:
            start = await self._last_id(job_id)
            reader = self.readers.get(job_id)  # another watcher may have started one meanwhile
            if reader is None:
                reader = _Reader(self, job_id, start)
                self.readers[job_id] = reader
        reader.subs.add(sub)
        if reader.task is None or reader.task.done():
            reader.task = asyncio.create_task(reader.run(), name=f"live-reader-{job_id}")
        try:
            yield sub
        finally:
            reader.subs.discard(sub)

    async def _last_id(self, job_id: str) -> str:
        reply: Any = await self.redis.xrevrange(Keys.telemetry(job_id), "+", "-", count=1)
        return text(reply[0][0]) if reply else str(ORIGIN)

    async def read_range(self, job_id: str, after: Cursor, count: int = 1000) -> list[LiveEntry]:
        """Entries strictly after ``after`` still held by the stream (one page)."""
        raw: Any = await self.redis.xrange(
            Keys.telemetry(job_id), min=f"({after}", max="+", count=count
        )
        out = []
        for eid, fields in raw:
            try:
                out.append(LiveEntry(Cursor.of_entry(eid), decode(fields)))
            except (KeyError, ValueError):
                log.error("job %s: undecodable stream entry %r skipped", job_id, eid)
        return out

    async def close(self) -> None:
        """Stop every reader and close the pool."""
        tasks = [r.task for r in self.readers.values() if r.task is not None]
        for reader in self.readers.values():
            reader.subs.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.readers.clear()
        await self.redis.aclose()
        await self.pool.disconnect()
