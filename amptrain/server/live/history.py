"""A watcher's reads of SQL: the job's state and its recorded history after a cursor.

The recorder commits each job's stream in order, so SQL holds a prefix of the
stream (plus the ``0-{id}`` events of the job before its first claim). A history
read fixes its end first -- the newest recorded point, then the evaluations and events,
whichever is newest -- and returns everything up to it: nothing recorded meanwhile can fall
between two pages.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import anyio
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.cursor import Cursor
from amptrain.contract.metrics import VALUE_KINDS
from amptrain.server.live.messages import JobState
from amptrain.store import events, jobs
from amptrain.store.history import points as metrics
from amptrain.store.history import values

T = TypeVar("T")

Record = tuple[Cursor, str, dict[str, Any]]
"""(cursor, ``"metric"``, ``"eval"``, ``"layer_grad_norm"`` or ``"event"``, the record as the
store gives it)."""


class History:
    def __init__(self, sessions: sessionmaker[Session], job_id: str, page: int) -> None:
        self.sessions = sessions
        self.job_id = job_id
        self.page = page

    async def job(self) -> JobState | None:
        return await self._db(self._job_state)

    async def after(self, cursor: Cursor) -> AsyncIterator[Record]:
        """Every recorded point, evaluation and event beyond ``cursor``, in cursor order (the
        evaluations and events, few next to the points, are read whole and merged in)."""
        upto, pending = await self._db(functools.partial(self._events_and_end, after=cursor))
        if upto is None:
            return
        after = cursor
        while True:
            read = functools.partial(self._points, after=after, upto=upto)
            items: list[dict[str, Any]] = await self._db(read)
            for item in items:
                pos = Cursor.of_entry(item["cursor"])
                while pending and pending[0][0] < pos:
                    yield pending.popleft()
                yield pos, "metric", item
                after = pos
            if len(items) < self.page:
                break
        for record in pending:
            yield record

    # -- in a worker thread -------------------------------------------------------------

    async def _db(self, fn: Callable[[Session], T]) -> T:
        def run() -> T:
            with self.sessions() as s:
                return fn(s)

        return await anyio.to_thread.run_sync(run)

    def _job_state(self, s: Session) -> JobState | None:
        job = jobs.get_job(s, self.job_id)
        if job is None:
            return None
        error = (
            {"code": job.error_code, "message": job.error_message or ""} if job.error_code else None
        )
        return JobState(job.status, job.attempt, job.telemetry_done, error, job.step or 0)

    def _events_and_end(self, s: Session, after: Cursor) -> tuple[Cursor | None, deque[Record]]:
        # The end first: the newest point, evaluation and (read after them) event. The
        # recorder commits each job's stream in order, a batch at a time, so all up to the
        # newest of them was committed when it was seen, and the reads that follow (each
        # statement sees what was committed before it) find it all, whatever lands meanwhile.
        newest = [metrics.newest_cursor(s, self.job_id)]
        newest += [values.newest_cursor(s, self.job_id, kind) for kind in VALUE_KINDS]
        found: list[Record] = [
            (c, "event", e) for c, e in events.events_after(s, self.job_id, after)
        ]
        ends = [c for c in (*newest, found[-1][0] if found else None) if c is not None]
        upto = max(ends) if ends else None
        if upto is not None:
            for kind in VALUE_KINDS:
                found += self._values(s, kind, after, upto)
        found.sort(key=lambda r: r[0])
        return upto, deque(found)

    def _values(self, s: Session, kind: str, after: Cursor, upto: Cursor) -> list[Record]:
        """Every ``kind`` record (evaluations, layer norms) after ``after`` up to ``upto``."""
        found: list[Record] = []
        position: Cursor | None = after
        while True:
            page, _ = values.eval_page(
                s, self.job_id, metrics.Page(position, self.page, "all", upto), kind
            )
            found += [(Cursor.parse(e["cursor"]), kind, e) for e in page]
            if len(page) < self.page:
                return found
            position = found[-1][0]

    def _points(self, s: Session, after: Cursor, upto: Cursor) -> list[dict[str, Any]]:
        items, _ = metrics.metric_page(s, self.job_id, metrics.Page(after, self.page, "all", upto))
        return items
