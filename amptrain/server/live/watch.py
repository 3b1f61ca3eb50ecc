"""One watcher's message sequence: SQL history after a cursor, then the live stream tail,
with no gap and no duplicate at the seam. Shared by the WebSocket and SSE routes.

Messages are JSON ``{"type", "cursor", "data"}`` with type ``metric``, ``eval``, ``event``,
``end``, ``heartbeat`` or ``gap`` (:mod:`amptrain.server.live.messages`). A watcher that
asks for batch frames gets its metric and event messages grouped into ``batch`` frames
instead, one per delivery round: 1,000 watchers cost one socket write each per round,
not one per record, and watchers at the same position share one encoded frame.

Cursor scheme (one cursor, the one ``GET /jobs/{id}/metrics`` uses):

- Every metric, eval and event message carries its :class:`~amptrain.contract.cursor.Cursor`: the
  stream entry id it was appended with, which SQL keeps with the recorded row, or
  ``0-{id}`` for the events of a job before its first claim (how each event gets its
  one cursor: :mod:`amptrain.contract.stream`). History and the live tail therefore
  show every record at the same position, and every watcher of a job sees the same
  sequence; a client that reconnects with ``after=`` its last cursor loses and
  repeats nothing.
- ``end``, ``heartbeat`` and ``gap`` carry the cursor to resume from (the last one sent).
- History shows every attempt's points in recording order (``attempts=all``), exactly
  as a live watcher saw them; after a resume the steps of the new attempt follow. Within
  a connection (attempt, step) only grows: a re-sent duplicate or a straggler from an
  attempt that lost its lease is skipped (its cursor still advances).

The sequence: a finished job whose telemetry is complete gets history then ``end``. A
live job subscribes to the hub *first*, then reads SQL history, then reads what the
stream holds beyond it (covering the recorder's lag), then the live queue, dropping
anything at or below the last position sent. The stream's ``end`` entry (or, failing
that, SQL saying the job finished and its telemetry is complete) closes it with ``end``
once SQL holds the whole history. A watcher too slow for its bounded queue gets ``gap``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.cursor import ORIGIN, Cursor
from amptrain.contract.metrics import VALUE_KINDS
from amptrain.server.live.history import History
from amptrain.server.live.hub import LiveBatch, LiveHub
from amptrain.server.live.messages import (
    JobState,
    Out,
    Round,
    batch_frames,
    end_out,
    entry_out,
    gap_out,
    heartbeat_out,
    record_out,
)

END_WAIT_S = 10.0
"""After the stream's ``end``, how long to wait for the recorder to finish SQL history."""


class Watch:
    """``Watch(hub, sessions, job_id, after).messages()`` yields :class:`Out` until the
    job ends or the watcher falls too far behind. ``after`` is already validated."""

    def __init__(
        self,
        hub: LiveHub,
        sessions: sessionmaker[Session],
        job_id: str,
        after: Cursor | None = None,
        *,
        heartbeat_s: float = 10.0,
        page: int = 1000,
    ) -> None:
        self.hub = hub
        self.history = History(sessions, job_id, page)
        self.job_id = job_id
        self.last = after or ORIGIN
        self.heartbeat_s = heartbeat_s
        self.page = page
        self.overflowed = asyncio.Event()
        self._newest_point = (0, 0)  # (attempt, step) of the newest metric sent
        self._events_sent: set[tuple[Any, ...]] = set()

    @property
    def cursor(self) -> str | None:
        return str(self.last) if self.last != ORIGIN else None

    async def messages(self, *, batch: bool = False) -> AsyncGenerator[Out, None]:
        """The watcher's messages; with ``batch``, metric and event messages come grouped
        in ``batch`` frames (:func:`~amptrain.server.live.messages.batch_frames`)."""
        async with contextlib.aclosing(self.rounds(grouped=batch)) as rounds:
            async for round_ in rounds:
                for out in batch_frames(round_) if batch else round_.outs:
                    yield out

    async def rounds(self, *, grouped: bool = False) -> AsyncGenerator[Round, None]:
        """The message sequence, one :class:`Round` per history page or delivery;
        ``grouped``: the rounds become batch frames, so the hub may pace them."""
        job = await self.history.job()
        if job is None:
            return
        if job.complete:
            async for round_ in self._history():
                yield round_
            yield Round([end_out(self.cursor, job)])
            return
        async with self.hub.subscribe(self.job_id, grouped=grouped) as sub:
            sub.on_overflow = self.overflowed.set
            async for round_ in self._history():
                yield round_
            async for round_ in self._catch_up():
                yield round_
                if round_.ended:
                    return
            while True:
                await sub.wait(self.heartbeat_s)
                if sub.overflowed:
                    self.overflowed.set()
                    yield Round([gap_out(self.cursor)])
                    return
                batches = sub.take()
                if batches:
                    # The hot path of 1,000 watchers: no nested generator per round.
                    round_, end = self._live(batches)
                    if round_.outs:
                        yield round_
                    if end is not None:
                        yield Round([await self._final_end(end)])
                        return
                    continue
                yield Round([heartbeat_out(self.cursor)])
                job = await self.history.job()
                if job is None or job.complete:
                    async for round_ in self._history():
                        yield round_
                    if job is not None:
                        yield Round([end_out(self.cursor, job)])
                    return

    async def _history(self) -> AsyncIterator[Round]:
        outs: list[Out] = []
        async for pos, kind, record in self.history.after(self.last):
            self.last = pos
            if self._is_new(kind, record):
                outs.append(record_out(kind, str(pos), record))
                if len(outs) >= self.page:
                    yield Round(outs)
                    outs = []
        if outs:
            yield Round(outs)

    async def _catch_up(self) -> AsyncIterator[Round]:
        """What the stream holds beyond SQL history (the recorder's lag), page by page."""
        while True:
            page = await self.hub.read_range(self.job_id, self.last, self.page)
            async for round_ in self._deliver([LiveBatch(page)] if page else []):
                yield round_
                if round_.ended:
                    return
            if len(page) < self.page:
                return

    async def _deliver(self, batches: list[LiveBatch]) -> AsyncIterator[Round]:
        """The rounds for stream entries: their records, then ``end`` if the stream ended
        (the records go out first: ``end`` may wait for the recorder)."""
        round_, end = self._live(batches)
        if round_.outs:
            yield round_
        if end is not None:
            yield Round([await self._final_end(end)])

    def _live(self, batches: list[LiveBatch]) -> tuple[Round, dict[str, Any] | None]:
        """The messages for stream entries, and the stream's end entry if one came. The
        round is shareable (through the last batch) when every entry became a message.

        A watcher before a batch of growing metric points (the common case) takes the
        batch's shared messages whole: 1,000 watchers do not each look at every record."""
        out: list[Out] = []
        whole = True
        for batch in batches:
            points = _prepare(batch)
            if (
                points is not None
                and batch.entries[0].pos > self.last
                and points[0] > self._newest_point
            ):
                out.extend(batch.messages or ())
                self.last = batch.entries[-1].pos
                self._newest_point = points[1]
                continue
            for entry in batch.entries:
                if entry.pos <= self.last:
                    whole = False
                    continue
                kind = entry.item["kind"]
                if kind == "end":
                    return Round(out), entry.item
                self.last = entry.pos
                if self._is_new(kind, entry.item):
                    out.append(entry_out(entry))
                else:
                    whole = False
        shared = batches[-1].frames if whole and batches else None
        return Round(out, shared), None

    def _is_new(self, kind: str, record: dict[str, Any]) -> bool:
        """A watcher never gets a record twice, nor a point at or before one it already has:
        a record the worker re-sent after Redis lost data (an event keeps the time it was
        made), or a straggler of an attempt that lost its lease. SQL drops the same ones."""
        if kind in VALUE_KINDS:
            # A re-sent evaluation or layer-norm record (new entry id) keeps its attempt and
            # step; SQL keeps one.
            key: tuple[Any, ...] = (kind, record["attempt"], record["step"])
            if key in self._events_sent:
                return False
            self._events_sent.add(key)
            return True
        if kind != "metric":
            key = (record["attempt"], record["type"], record["step"], record["time"])
            if key in self._events_sent:
                return False
            self._events_sent.add(key)
            return True
        point = (record["attempt"], record["step"])
        if point <= self._newest_point:
            return False
        self._newest_point = point
        return True

    async def _final_end(self, item: dict[str, Any]) -> Out:
        """The stream ended: wait (bounded) until SQL holds every record, then ``end``."""
        deadline = time.monotonic() + END_WAIT_S
        while True:
            job = await self.history.job()
            if job is None or job.complete or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        if job is None:
            return end_out(self.cursor, JobState(str(item.get("status")), 0, True, None, 0))
        return end_out(self.cursor, job)


def _prepare(batch: LiveBatch) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """Build the batch's shared messages once; its (first, last) points if it holds only
    metrics whose (attempt, step) grow strictly, else None."""
    if batch.messages is None:
        entries = batch.entries
        if entries and all(e.item["kind"] == "metric" for e in entries):
            batch.messages = [entry_out(e) for e in entries]
            points = [(e.item["attempt"], e.item["step"]) for e in entries]
            if all(a < b for a, b in itertools.pairwise(points)):
                batch.points = (points[0], points[-1])
        else:
            batch.messages = []
    return batch.points
