"""One watcher's message sequence: SQL history after a cursor, then the live stream tail,
with no gap and no duplicate at the seam. Shared by the WebSocket and SSE routes.

Messages are JSON ``{"type", "cursor", "data"}`` with type ``metric``, ``event``,
``end``, ``heartbeat`` or ``gap``.

Cursor scheme (one cursor, the one ``GET /jobs/{id}/metrics`` uses):

- Every position is a Redis stream entry id ``"ms-seq"``. A metric message's cursor is
  its entry id (stored in SQL as stream_ms/stream_seq); an engine event's (checkpoint,
  warning, ...) is its entry id too (SQL ``source_id``). Both are exact: a client that
  reconnects with ``after=`` its last cursor loses and repeats none of them.
- Lifecycle events written by the supervisor (started, succeeded, ...) reach SQL before
  the stream and carry no entry id there. Live they carry their entry id; from SQL they
  are placed at ``"{time in ms}-0"`` (the database clock: exact ordering on one machine,
  approximate across machines with skewed clocks). Within a connection they are
  de-duplicated by (attempt, type, step); a SQL lifecycle event newer than the recorded
  history is held back until its stream copy arrives (or the job ends), so cursors
  only ever grow.
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
import functools
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from api.contracts.jsonsafe import finite
from api.services.live_hub import LiveEntry, LiveHub, Position, format_position, parse_position
from api.store.metrics import metric_page
from api.store.models import FINISHED_STATUSES, Job, JobEvent, MetricPoint
from trainer_core.contract.records import METRIC_FIELDS

T = TypeVar("T")

END_WAIT_S = 10.0
"""After the stream's ``end``, how long to wait for the recorder to finish SQL history."""


@dataclass(frozen=True, slots=True)
class Out:
    """An outgoing message: its type, its cursor and its JSON text."""

    type: str
    cursor: str | None
    text: str


@dataclass(frozen=True, slots=True)
class _JobState:
    status: str
    attempt: int
    telemetry_done: bool
    error: dict[str, Any] | None
    step: int

    @property
    def complete(self) -> bool:
        """Finished, and every record of it is in SQL (a job never claimed has none)."""
        return self.status in FINISHED_STATUSES and (self.telemetry_done or self.attempt == 0)


@dataclass(slots=True)
class _Event:
    pos: Position
    exact: bool  # position is the entry id (engine events, live copies)
    key: tuple[int, str, int | None]
    data: dict[str, Any]


def message(type_: str, cursor: str | None, data: dict[str, Any]) -> str:
    return json.dumps(
        {"type": type_, "cursor": cursor, "data": finite(data)}, separators=(",", ":")
    )


class Watch:
    """``Watch(hub, sessions, job_id, after).messages()`` yields :class:`Out` until the
    job ends or the watcher falls too far behind."""

    def __init__(
        self,
        hub: LiveHub,
        sessions: sessionmaker[Session],
        job_id: str,
        after: str | None = None,
        *,
        heartbeat_s: float = 10.0,
        page: int = 1000,
    ) -> None:
        self.hub = hub
        self.sessions = sessions
        self.job_id = job_id
        self.after: Position = parse_position(after) if after else (0, 0)
        self.last: Position = self.after
        self.heartbeat_s = heartbeat_s
        self.page = page
        self.overflowed = asyncio.Event()
        self._skip: set[tuple[int, str, int | None]] = set()
        self._newest_point = (0, 0)  # (attempt, step) of the newest metric sent
        self._withheld: dict[tuple[int, str, int | None], _Event] = {}

    @property
    def cursor(self) -> str | None:
        return format_position(self.last) if self.last != (0, 0) else None

    async def messages(self) -> AsyncGenerator[Out, None]:
        job = await self._db(self._job_state)
        if job is None:
            return
        if job.complete:
            async for out in self._history(final=True):
                yield out
            yield self._end(job)
            return
        async with self.hub.subscribe(self.job_id) as sub:
            sub.on_overflow = self.overflowed.set
            async for out in self._history(final=False):
                yield out
            async for out in self._catch_up():
                yield out
                if out.type == "end":
                    return
            while True:
                await sub.wait(self.heartbeat_s)
                if sub.overflowed:
                    self.overflowed.set()
                    yield self._gap()
                    return
                entries = sub.take()
                if entries:
                    for out in await self._live(entries):
                        yield out
                        if out.type == "end":
                            return
                    continue
                yield Out("heartbeat", self.cursor, self._heartbeat())
                job = await self._db(self._job_state)
                if job is None or job.complete:
                    async for out in self._history(final=True):
                        yield out
                    if job is not None:
                        yield self._end(job)
                    return

    # -- history from SQL ---------------------------------------------------------------

    async def _history(self, final: bool) -> AsyncIterator[Out]:
        events, sql_end = await self._db(self._load_events)
        pending = self._select_events(events, sql_end, final)
        cursor = format_position(self.last) if self.last != (0, 0) else None
        while True:
            items, _ = await self._db(functools.partial(self._points, after=cursor))
            for item in items:
                pos = parse_position(item["cursor"])
                while pending and pending[0].pos < pos:
                    yield self._event_out(pending.pop(0))
                data = {f: item[f] for f in METRIC_FIELDS}
                data["attempt"] = item["attempt"]
                if pos > self.last:
                    self.last = pos
                    if self._is_new_point(item["attempt"], item["step"]):
                        yield Out("metric", item["cursor"], message("metric", item["cursor"], data))
            if len(items) < self.page:
                break
            cursor = items[-1]["cursor"]
        for ev in pending:
            yield self._event_out(ev)

    def _select_events(self, events: list[_Event], sql_end: Position, final: bool) -> list[_Event]:
        """Events to send from SQL now; later lifecycle ones wait for their stream copy."""
        chosen = []
        for ev in events:
            if ev.exact:
                if ev.pos > self.last:
                    chosen.append(ev)
                continue
            if ev.key in self._skip:
                continue
            if ev.pos <= self.after:
                self._skip.add(ev.key)  # delivered by an earlier connection
            elif final or ev.key[0] == 0 or ev.pos <= sql_end:
                # attempt 0 events (queued) never reach the stream: nothing to wait for.
                chosen.append(ev)
                self._withheld.pop(ev.key, None)
            else:
                self._withheld[ev.key] = ev
        return sorted(chosen, key=lambda e: e.pos)

    def _event_out(self, ev: _Event) -> Out:
        if not ev.exact:
            self._skip.add(ev.key)
        self.last = max(self.last, ev.pos)
        cursor = format_position(self.last)
        return Out("event", cursor, message("event", cursor, ev.data))

    # -- the stream ---------------------------------------------------------------------

    async def _catch_up(self) -> AsyncIterator[Out]:
        """What the stream holds beyond SQL history (the recorder's lag), page by page."""
        while True:
            page = await self.hub.read_range(self.job_id, self.last, self.page)
            for out in await self._live(page):
                yield out
                if out.type == "end":
                    return
            if len(page) < self.page:
                return

    async def _live(self, entries: Iterable[LiveEntry]) -> list[Out]:
        out: list[Out] = []
        for entry in entries:
            if entry.pos <= self.last:
                continue
            kind = entry.item["kind"]
            if kind == "end":
                out.extend(self._event_out(ev) for ev in self._flush_withheld())
                out.append(await self._final_end(entry.item))
                return out
            if kind == "event" and entry.item.get("persisted"):
                key = (entry.item["attempt"], entry.item["type"], entry.item["step"])
                if key in self._skip:
                    continue
                self._skip.add(key)
                self._withheld.pop(key, None)
            self.last = entry.pos
            if kind == "metric" and not self._is_new_point(
                entry.item["attempt"], entry.item["step"]
            ):
                continue
            out.append(Out(_type_of(kind), format_position(entry.pos), _entry_text(entry)))
        return out

    def _is_new_point(self, attempt: int, step: int) -> bool:
        """A watcher never gets a point at or before one it already has: a record the worker
        re-sent after Redis lost data, or a straggler of an attempt that lost its lease."""
        if (attempt, step) <= self._newest_point:
            return False
        self._newest_point = (attempt, step)
        return True

    def _flush_withheld(self) -> list[_Event]:
        held = sorted(self._withheld.values(), key=lambda e: e.pos)
        self._withheld.clear()
        return held

    async def _final_end(self, item: dict[str, Any]) -> Out:
        """The stream ended: wait (bounded) until SQL holds every record, then ``end``."""
        deadline = time.monotonic() + END_WAIT_S
        while True:
            job = await self._db(self._job_state)
            if job is None or job.complete or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        if job is None:
            return self._end(_JobState(str(item.get("status")), 0, True, None, 0))
        return self._end(job)

    # -- message helpers ----------------------------------------------------------------

    def _end(self, job: _JobState) -> Out:
        data = {"status": job.status, "error": job.error, "step": job.step}
        return Out("end", self.cursor, message("end", self.cursor, data))

    def _gap(self) -> Out:
        data = {"reason": "slow consumer: resume from this cursor", "resume_after": self.cursor}
        return Out("gap", self.cursor, message("gap", self.cursor, data))

    def _heartbeat(self) -> str:
        return message("heartbeat", self.cursor, {"time": time.time()})

    # -- database -----------------------------------------------------------------------

    async def _db(self, fn: Callable[[Session], T]) -> T:
        def run() -> T:
            with self.sessions() as s:
                return fn(s)

        return await anyio.to_thread.run_sync(run)

    def _points(self, s: Session, after: str | None) -> tuple[list[dict[str, Any]], str | None]:
        return metric_page(s, self.job_id, after, self.page, attempts="all")

    def _job_state(self, s: Session) -> _JobState | None:
        job = s.get(Job, self.job_id)
        if job is None:
            return None
        error = (
            {"code": job.error_code, "message": job.error_message or ""} if job.error_code else None
        )
        return _JobState(job.status, job.attempt, job.telemetry_done, error, job.step or 0)

    def _load_events(self, s: Session) -> tuple[list[_Event], Position]:
        rows = s.scalars(
            sa.select(JobEvent).where(JobEvent.job_id == self.job_id).order_by(JobEvent.id)
        ).all()
        events = [_event_from_row(r) for r in rows]
        p = MetricPoint
        newest = s.execute(
            sa.select(p.stream_ms, p.stream_seq)
            .where(p.job_id == self.job_id)
            .order_by(p.stream_ms.desc(), p.stream_seq.desc())
            .limit(1)
        ).first()
        sql_end = (int(newest[0]), int(newest[1])) if newest else (0, 0)
        exact = [e.pos for e in events if e.exact]
        return events, max([sql_end, *exact])


def _event_from_row(row: JobEvent) -> _Event:
    data = {
        "id": row.id,
        "attempt": row.attempt,
        "type": row.type,
        "step": row.step,
        "time": row.time,
        "data": row.data or {},
    }
    if row.source_id:
        return _Event(parse_position(row.source_id), True, (row.attempt, row.type, row.step), data)
    pos = (int(row.time * 1000), 0)
    return _Event(pos, False, (row.attempt, row.type, row.step), data)


def _type_of(kind: str) -> str:
    return "metric" if kind == "metric" else "event"


def _entry_text(entry: LiveEntry) -> str:
    """The message for a stream entry, encoded once and shared by every watcher."""
    if entry.text is None:
        item = entry.item
        cursor = format_position(entry.pos)
        if item["kind"] == "metric":
            data = {f: item.get(f) for f in METRIC_FIELDS}
            data["attempt"] = item["attempt"]
            entry.text = message("metric", cursor, data)
        else:
            data = {
                "id": None,
                "attempt": item["attempt"],
                "type": item["type"],
                "step": item["step"],
                "time": item["time"],
                "data": item.get("data") or {},
            }
            entry.text = message("event", cursor, data)
    return entry.text
