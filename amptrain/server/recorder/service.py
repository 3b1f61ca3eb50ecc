"""The recorder: moves telemetry from each job's Redis Stream into SQL.

Runs in every API process (a thread). SQL decides which streams matter, and each
job has ONE owner among the processes at a time (:mod:`amptrain.server.recorder.owner`),
so a job's points commit in stream order and the cursor never skips a point.

Per job, the consumer group (:mod:`amptrain.server.recorder.group`) hands over a
previous owner's entries first, then pending, then new ones. A batch is
bulk-inserted with ON CONFLICT DO NOTHING (points unique by job, attempt, step;
events by stream entry id) and acknowledged only after its transaction commits,
so a crash re-delivers it and replaying changes nothing.

Every event reaches SQL this way, with its entry id as its cursor. Events the API
wrote to SQL about a job that has run are appended to the job's stream here once
the stream is drained, and get their cursor when read back (see
:mod:`amptrain.contract.stream`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from datetime import timedelta
from typing import Any

import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.stream import text
from amptrain.core.redis import Keys
from amptrain.server.recorder.group import GROUP as GROUP
from amptrain.server.recorder.group import ConsumerGroup, is_nogroup
from amptrain.server.recorder.owner import Owned, Ownership
from amptrain.server.recorder.writer import BatchWriter
from amptrain.store.models import utcnow

log = logging.getLogger(__name__)

LINGER_S = 0.2
"""After a pass in which no stream filled a page, wait this long before the next read (see
:meth:`Recorder.run`): a job at 100 steps/s is in SQL within ~0.3 s, in ~20-point batches."""
REFRESH_S = 1.0
"""How often the set of jobs to record is re-read from SQL (and their locks renewed)."""


class Recorder:
    """``Recorder(settings, session_factory, redis).run(stop_event)``; tests call
    :meth:`drain_once`. ``redis`` must use a socket timeout above ``block_ms``."""

    def __init__(
        self,
        settings: Any,
        session_factory: sessionmaker[Session],
        redis_client: redis.Redis,
        *,
        block_ms: int = 1000,
        batch: int = 2000,
        per_pass: int = 40_000,
        lock_ttl_ms: int = 15_000,
        finished_grace_s: float = 60.0,
        stream_ttl_s: int = 3600,
        consumer: str | None = None,
    ) -> None:
        self.settings = settings
        self.sessions = session_factory
        self.redis = redis_client
        self.block_ms = block_ms
        self.batch = batch  # entries per stream and read, at most
        # Entries per read (so per transaction) over all streams. What a batch writes grows
        # with its series' chunks, not its points: a job's page of 2,000 points rewrites
        # each series' open chunk and its roll-ups once, as a page of 500 does. Draining 20
        # jobs (bench/recorder_throughput.py's defaults, PostgreSQL, medians of three runs),
        # 10,000 -> 40,000 (pages of 500 -> 2,000) took the recorder from 13.0 to 9.2 us of
        # CPU a point and the database from 14.3 to 5.3, for a peak RSS 46 MiB higher (149
        # -> 195 MiB) and SQL trailing a flood by 0.44 -> 0.59 s.
        self.per_pass = per_pass
        self.finished_grace_s = finished_grace_s
        consumer = consumer or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.group = ConsumerGroup(redis_client, consumer, batch)
        self.ownership = Ownership(session_factory, redis_client, lock_ttl_ms / 1000)
        self.writer = BatchWriter(
            session_factory, redis_client, self.group, self.ownership, stream_ttl_s
        )
        self._refreshed_at = 0.0
        self._relayed = 0  # jobs given events by the last pass, still to be read back
        self._full = False  # the last pass filled a page of some stream: more is waiting

    @property
    def owned(self) -> dict[str, Owned]:
        return self.ownership.jobs

    # -- loop ------------------------------------------------------------------

    def run(self, stop_event: Any) -> None:
        """Record until ``stop_event`` (a threading.Event) is set; survives Redis and
        database outages by backing off and starting over."""
        backoff = 0.5
        try:
            while not stop_event.is_set():
                try:
                    moved = self._pass(self.block_ms)
                    backoff = 0.5
                    if not self.owned or (moved == 0 and self.block_ms == 0):
                        stop_event.wait(self.block_ms / 1000 or 0.5)
                    elif moved and not self._full:
                        # Let more entries gather: one transaction per LINGER_S instead of
                        # one per step keeps the API's event loop (same GIL) responsive and
                        # the batches large. Live watchers read the stream, not SQL, so they
                        # wait for nothing.
                        stop_event.wait(LINGER_S)
                except (redis.RedisError, sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
                    log.warning("recorder: %s; retrying in %.1fs", exc, backoff)
                    self._forget_all()
                    stop_event.wait(backoff)
                    backoff = min(backoff * 2, 10.0)
                except Exception:
                    log.exception("recorder pass failed")
                    self._forget_all()
                    stop_event.wait(1.0)
        finally:
            self.close()

    def drain_once(self) -> int:
        """Record everything available now, without blocking; returns entries handled."""
        total = 0
        while True:
            moved = self._pass(None, refresh=True)
            total += moved
            if moved == 0 and not self._relayed:
                return total

    def close(self) -> None:
        """Give up every job lock so another process takes over at once."""
        self.ownership.release_all()

    # -- one pass --------------------------------------------------------------

    def _pass(self, block_ms: int | None, *, refresh: bool = False) -> int:
        now = time.monotonic()
        tick = refresh or not self.owned or now - self._refreshed_at >= REFRESH_S
        if tick:
            self.ownership.refresh()
            self._refreshed_at = now
        moved = self._catch_up_all()
        if not self.owned:
            return moved
        # Many busy jobs share one transaction of about per_pass entries; one busy job gets
        # pages of `batch`. Either way the per-transaction cost is spread over thousands.
        page = max(1, min(self.batch, self.per_pass // len(self.owned)))
        try:
            reply = self.group.read_new(map(Keys.telemetry, self.owned), block_ms, page)
        except redis.ResponseError as exc:
            if not is_nogroup(exc):
                raise
            # Redis lost data (restart without AOF, FLUSHALL): re-create the groups from
            # id 0 and read again; the worker re-sends what SQL lacks, replays insert nothing.
            log.warning("recorder: consumer group missing; re-creating")
            self._forget_all()
            moved += self._catch_up_all()
            reply = self.group.read_new(map(Keys.telemetry, self.owned), None, page)
        taken = {
            job_id: entries
            for key, entries in reply
            if entries and (job_id := _job_of(key)) in self.owned
        }
        got = {job_id: len(entries) for job_id, entries in taken.items()}
        self._full = any(n >= page for n in got.values())
        if taken:
            moved += self.writer.record(taken)
        if tick:
            # Only a drained stream may take an event from SQL: anything appended before
            # (say, by a pass that then crashed) has been read back and stamped by now.
            drained = [j for j in self.owned if got.get(j, 0) < page]
            pending = self.writer.relay(drained)
            self._relayed = len(pending)
            cutoff = utcnow() - timedelta(seconds=self.finished_grace_s)
            self.writer.sweep_finished(set(got) | pending, cutoff)
        return moved

    def _catch_up_all(self) -> int:
        moved = 0
        for job_id, own in list(self.owned.items()):
            if not own.caught_up:
                moved += self._catch_up(job_id)
                own.caught_up = True
        return moved

    def _catch_up(self, job_id: str) -> int:
        """Take over what a previous owner left unacknowledged, then our own pending entries."""
        key = Keys.telemetry(job_id)
        self.group.take_over(key)
        moved, last = 0, "0-0"
        while job_id in self.owned:
            entries = self.group.pending_after(key, last)
            if not entries:
                break
            moved += self.writer.record({job_id: entries})
            last = text(entries[-1][0])
        return moved

    def _forget_all(self) -> None:
        self.group.forget()
        self.ownership.forget_progress()


def _job_of(key: str) -> str:
    # "amptrain:job:{id}:telemetry"
    return key.split(":")[2]
