"""The recorder: moves telemetry from each job's Redis Stream into SQL.

Runs in every API process (a thread). SQL decides which streams matter: jobs with
``telemetry_done = false`` and ``attempt > 0``, so the work survives Redis losing
its data. Each job has ONE owner among the processes at a time (a Redis lock,
renewed while held), so a job's points commit in stream order and the metrics
cursor (the stream entry id) never skips a point.

Per job: consumer group ``recorder`` (re-created on NOGROUP), entries of a
previous owner are claimed first, then pending, then new ones. A batch is
bulk-inserted with ON CONFLICT DO NOTHING (points unique by job, attempt, step;
engine events by stream entry id) and acknowledged only after its transaction
commits, so a crash re-delivers it and replaying changes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from api.contracts.cursor import Cursor
from api.contracts.jsonsafe import finite
from api.contracts.stream import decode, recorded_key, telemetry_key
from api.services import observability
from api.store import metrics, recording
from api.store.models import FINISHED_STATUSES, Job, utcnow
from trainer_core.contract.records import METRIC_FIELDS

log = logging.getLogger(__name__)

GROUP = "recorder"

_ACQUIRE_OR_RENEW = """
local v = redis.call('get', KEYS[1])
if not v then redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
if v == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""

Entry = tuple[str, dict[Any, Any] | None]


LINGER_S = 0.05
"""After a small batch, wait this long before the next read (see :meth:`Recorder.run`)."""
REFRESH_S = 1.0
"""How often the set of jobs to record is re-read from SQL (and their locks renewed)."""


def lock_key(job_id: str) -> str:
    return f"amptrain:recorder:job:{job_id}"


@dataclass
class _Owned:
    status: str
    attempt: int
    finished_at: Any
    caught_up: bool = False  # previous owner's and our own pending entries handled


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
        batch: int = 500,
        lock_ttl_ms: int = 15_000,
        finished_grace_s: float = 60.0,
        stream_ttl_s: int = 3600,
        consumer: str | None = None,
    ) -> None:
        self.settings = settings
        self.sessions = session_factory
        self.redis = redis_client
        self.block_ms = block_ms
        self.batch = batch
        self.lock_ttl_ms = lock_ttl_ms
        self.finished_grace_s = finished_grace_s
        self.stream_ttl_s = stream_ttl_s
        self.consumer = consumer or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.owned: dict[str, _Owned] = {}
        self._groups: set[str] = set()
        self._refreshed_at = 0.0

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
                    elif 0 < moved < self.batch:
                        # Let a few more entries gather: one transaction per 50 ms instead
                        # of one per step keeps the API's event loop (same GIL) responsive.
                        # Live watchers read the stream, not SQL, so they wait for nothing.
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
            if moved == 0:
                return total

    def close(self) -> None:
        """Give up every job lock so another process takes over at once."""
        for job_id in list(self.owned):
            self._release(job_id)

    def recorded_watermark(self, job_id: str, attempt: int, first_step: int = 1) -> int:
        """Highest contiguous step of this attempt already in SQL."""
        with self.sessions() as s:
            return metrics.recorded_watermark(s, job_id, attempt, first_step)

    # -- one pass --------------------------------------------------------------

    def _pass(self, block_ms: int | None, *, refresh: bool = False) -> int:
        now = time.monotonic()
        if refresh or not self.owned or now - self._refreshed_at >= REFRESH_S:
            self._refresh_ownership()
            self._refreshed_at = now
        moved = self._catch_up_all()
        if not self.owned:
            return moved
        try:
            reply = self._read_new(block_ms)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # Redis lost data (restart without AOF, FLUSHALL): re-create the groups from
            # id 0 and read again; the worker re-sends what SQL lacks, replays insert nothing.
            log.warning("recorder: consumer group missing; re-creating")
            self._forget_all()
            moved += self._catch_up_all()
            reply = self._read_new(None)
        got: set[str] = set()
        for key, entries in reply or []:
            job_id = _job_of(_s(key))
            if entries and job_id in self.owned:
                got.add(job_id)
                moved += self._record(job_id, entries)
        self._sweep_finished(got)
        return moved

    def _read_new(self, block_ms: int | None) -> Any:
        streams = {telemetry_key(j): ">" for j in self.owned}
        if not streams:
            return []
        return self.redis.xreadgroup(
            GROUP,
            self.consumer,
            streams,  # type: ignore[arg-type]
            count=self.batch,
            block=block_ms,
        )

    def _catch_up_all(self) -> int:
        moved = 0
        for job_id, own in list(self.owned.items()):
            if not own.caught_up:
                moved += self._catch_up(job_id)
                own.caught_up = True
        return moved

    def _refresh_ownership(self) -> None:
        with self.sessions() as s:
            rows = s.execute(
                sa.select(Job.id, Job.status, Job.attempt, Job.finished_at).where(
                    Job.telemetry_done == sa.false(), Job.attempt > 0
                )
            ).all()
        wanted = {r.id: r for r in rows}
        for job_id in list(self.owned):
            if job_id not in wanted:
                self._release(job_id)
        for job_id, row in wanted.items():
            if self._acquire(job_id):
                own = self.owned.get(job_id)
                if own is None:
                    self.owned[job_id] = _Owned(row.status, row.attempt, row.finished_at)
                else:
                    own.status, own.attempt, own.finished_at = (
                        row.status,
                        row.attempt,
                        row.finished_at,
                    )
            elif job_id in self.owned:
                log.warning("recorder lost job %s to another process", job_id)
                del self.owned[job_id]

    def _catch_up(self, job_id: str) -> int:
        """Take over what a previous owner left unacknowledged, then our own pending entries."""
        key = telemetry_key(job_id)
        try:
            self._claim_pending(key)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._groups.discard(key)
            self._claim_pending(key)
        moved, last = 0, "0-0"
        while job_id in self.owned:
            reply: Any = self.redis.xreadgroup(GROUP, self.consumer, {key: last}, count=self.batch)
            entries = reply[0][1] if reply else []
            if not entries:
                break
            moved += self._record(job_id, entries)
            last = _s(entries[-1][0])
        return moved

    def _claim_pending(self, key: str) -> None:
        self._ensure_group(key)
        start = "0-0"
        while True:  # XAUTOCLAIM walks the group's pending list; "0-0" means the end
            reply = self.redis.xautoclaim(key, GROUP, self.consumer, 0, start, count=self.batch)
            start = _s(reply[0])
            if start == "0-0":
                return

    # -- one batch -------------------------------------------------------------

    def _record(self, job_id: str, entries: Sequence[Entry]) -> int:
        points, events, ends = _parse(job_id, entries)
        ids = [_s(eid) for eid, _ in entries]
        done = False
        with self.sessions() as s:
            inserted = recording.insert_points(s, points)
            recording.insert_events(s, events)
            recording.update_progress(s, job_id, points, inserted)
            if ends:
                done = recording.mark_done(s, job_id, ends)
            if not self._acquire(job_id):
                # Someone else owns the job now: leave the batch to them.
                s.rollback()
                self.owned.pop(job_id, None)
                return 0
            s.commit()
        observability.points_recorded(len(inserted), points)
        key = telemetry_key(job_id)
        self.redis.xack(key, GROUP, *ids)
        # Tells the publisher what it may forget: everything up to here is in SQL.
        self.redis.set(recorded_key(job_id), ids[-1], ex=self.stream_ttl_s)
        if done:
            self._finish_stream(job_id)
        return len(entries)

    def _sweep_finished(self, got: set[str]) -> None:
        """Finished jobs whose ``end`` entry never came (worker died, cancelled while re-queued):
        once nothing arrived for the grace period, their telemetry is complete."""
        cutoff = utcnow() - timedelta(seconds=self.finished_grace_s)
        for job_id, own in list(self.owned.items()):
            if job_id in got or own.status not in FINISHED_STATUSES:
                continue
            if own.finished_at is None or own.finished_at > cutoff:
                continue
            with self.sessions.begin() as s:
                s.execute(sa.update(Job).where(Job.id == job_id).values(telemetry_done=True))
            self._finish_stream(job_id)

    def _finish_stream(self, job_id: str) -> None:
        self.redis.expire(telemetry_key(job_id), self.stream_ttl_s)
        self._release(job_id)

    # -- redis plumbing ---------------------------------------------------------

    def _acquire(self, job_id: str) -> bool:
        got = self.redis.eval(
            _ACQUIRE_OR_RENEW, 1, lock_key(job_id), self.consumer, self.lock_ttl_ms
        )
        return bool(got)

    def _release(self, job_id: str) -> None:
        self.owned.pop(job_id, None)
        with contextlib.suppress(redis.RedisError):  # else the lock expires on its own
            self.redis.eval(_RELEASE, 1, lock_key(job_id), self.consumer)

    def _ensure_group(self, key: str) -> None:
        if key in self._groups:
            return
        try:
            self.redis.xgroup_create(key, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups.add(key)

    def _forget_all(self) -> None:
        self._groups.clear()
        for own in self.owned.values():
            own.caught_up = False


# -- SQL ------------------------------------------------------------------------


def _parse(
    job_id: str, entries: Iterable[Entry]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    points: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    ends: list[int] = []
    for eid, fields in entries:
        if not fields:
            continue  # trimmed from the stream while pending
        try:
            item = decode(fields)
        except (KeyError, ValueError):
            log.error("job %s: undecodable stream entry %s dropped", job_id, _s(eid))
            continue
        entry_id = _s(eid)
        if item["kind"] == "metric":
            if isinstance(item.get("step"), int):
                points.append(_point_row(job_id, entry_id, item))
        elif item["kind"] == "event":
            if not item["persisted"]:
                events.append(_event_row(job_id, entry_id, item))
        elif item["kind"] == "end":
            ends.append(item["attempt"])
    return points, events, ends


def _point_row(job_id: str, entry_id: str, item: dict[str, Any]) -> dict[str, Any]:
    ms, seq = Cursor.of_entry(entry_id)
    row = {f: item.get(f) for f in METRIC_FIELDS}
    row.update(job_id=job_id, attempt=item["attempt"], stream_ms=ms, stream_seq=seq)
    return row


def _event_row(job_id: str, entry_id: str, item: dict[str, Any]) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "attempt": item["attempt"],
        "type": item["type"],
        "step": item["step"],
        "time": item["time"] if item["time"] is not None else time.time(),
        "data": finite(item["data"]),
        "source_id": entry_id,
    }


def _job_of(key: str) -> str:
    # "amptrain:job:{id}:telemetry"
    return key.split(":")[2]


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
