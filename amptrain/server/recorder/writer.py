"""What the recorder writes: a batch of stream entries into SQL in one transaction, then
their acknowledgement; the API's own events relayed into the streams; the end of a job's
telemetry.

The acknowledgement comes only after the commit, so a crash re-delivers the batch, and a
replay adds nothing: a chunk keeps a step's first value (by job, series, attempt and step),
and what is new in a batch is what its chunks gained; events are unique by stream entry id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain, compress, repeat
from typing import Any

import redis
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import EVAL_KIND
from amptrain.contract.stream import STREAM_MAXLEN, encode, text
from amptrain.core.redis import CANCEL_KEY_TTL_S, Keys
from amptrain.server import observability
from amptrain.server.recorder import alerting
from amptrain.server.recorder.entries import Batch, Entry, parse
from amptrain.server.recorder.group import ConsumerGroup
from amptrain.server.recorder.owner import Ownership
from amptrain.store import events, recording
from amptrain.store.history import chunk_writes, eval_summary, rollups
from amptrain.store.history.chunk_parts import MS, SHIFT, STEP_KIND, Key
from amptrain.store.history.chunk_writes import Gains


@dataclass
class BatchWriter:
    """Writes for one recorder: its sessions, Redis client, consumer group and job locks."""

    sessions: sessionmaker[Session]
    redis: redis.Redis
    group: ConsumerGroup
    ownership: Ownership
    stream_ttl_s: int

    def record(self, taken: Mapping[str, Sequence[Entry]]) -> int:
        """Every job's entries in ONE transaction (each job's in stream order), then XACK:
        a crash before the acknowledgement re-delivers them, and replaying adds nothing."""
        ends: list[str] = []
        owned = self.ownership.jobs
        with self.sessions() as s:
            batches = {job_id: parse(job_id, entries) for job_id, entries in taken.items()}
            points = [p for batch in batches.values() for p in batch.rows]
            columns = [b.columns for b in batches.values() if b.columns is not None]
            values = [v for b in batches.values() for v in b.values]
            # Into the series' chunks and their roll-ups (what every read reads), before the
            # summary's steady rate and the alert rules read them there.
            last: dict[Key, int] = {}
            gains = rollups.record(s, points, values, columns, last)
            cursors = _cursor_gains(gains)
            fresh = {job_id: _gained(b, gains, cursors) for job_id, b in batches.items()}
            newest = {job_id: point for job_id, (_, point) in fresh.items() if point}
            recording.update_progress(s, newest, gains, last)
            eval_summary.refresh(s, {key[0] for key in gains if key[1] == EVAL_KIND})
            overflowed: set[str] = set()
            for job_id, batch in batches.items():
                recording.insert_events(s, batch.events)
                overflowed |= recording.overflow_jobs(batch.events)
                if batch.ends and recording.mark_done(s, job_id, batch.ends):
                    chunk_writes.seal_job(s, job_id)
                    ends.append(job_id)
            recording.refresh_overflow_counts(s, overflowed)
            # Alert rules, in this transaction: a firing is stored with what caused it.
            stopping = alerting.evaluate(s, batches)
            lost = [job_id for job_id in taken if not self.ownership.hold(job_id)]
            if lost:
                # Someone else owns these jobs now: leave their entries to them, redo the rest.
                s.rollback()
                for job_id in lost:
                    owned.pop(job_id, None)
                rest = {j: e for j, e in taken.items() if j not in lost}
                return self.record(rest) if rest else 0
            s.commit()
        observability.points_recorded(
            sum(n for n, _ in fresh.values()),
            chain.from_iterable(b.column("time") for b in batches.values()),
        )
        # Tells the publishers what they may forget: everything up to here is in SQL.
        self.group.ack(
            # Ids as Redis gave them (bytes): XACK takes them as they are.
            {Keys.telemetry(j): [eid for eid, _ in e] for j, e in taken.items()},
            {Keys.recorded(j): text(e[-1][0]) for j, e in taken.items()},
            self.stream_ttl_s,
        )
        for job_id in stopping:
            # Like a user's cancel: the SQL status is the truth, the key only hurries it.
            self.redis.set(Keys.cancel(job_id), "1", ex=CANCEL_KEY_TTL_S)
        for job_id in ends:
            self.finish_stream(job_id)
        return sum(map(len, taken.values()))

    def relay(self, job_ids: list[str]) -> set[str]:
        """Append the events the API wrote to SQL about these jobs to their streams; the
        jobs that had any (their telemetry is not complete until those are read back)."""
        with self.sessions() as s:
            waiting = events.unstreamed(s, job_ids)
        if not waiting:
            return set()
        pipe = self.redis.pipeline(transaction=False)
        for ev in waiting:
            item = {"kind": "event", **ev}
            fields = encode(item, job_id=ev["job_id"], attempt=ev["attempt"])
            pipe.xadd(Keys.telemetry(ev["job_id"]), fields, maxlen=STREAM_MAXLEN, approximate=True)  # type: ignore[arg-type]
        pipe.execute()
        return {ev["job_id"] for ev in waiting}

    def sweep_finished(self, busy: set[str], cutoff: datetime) -> None:
        """Finished jobs whose ``end`` entry never came (worker died, cancelled while
        re-queued): once nothing arrived since ``cutoff``, their telemetry is complete."""
        for job_id, own in list(self.ownership.jobs.items()):
            if job_id in busy or not own.finished:
                continue
            if own.job.finished_at is None or own.job.finished_at > cutoff:
                continue
            with self.sessions.begin() as s:
                recording.mark_swept(s, job_id)
                chunk_writes.seal_job(s, job_id)
            self.finish_stream(job_id)

    def finish_stream(self, job_id: str) -> None:
        self.redis.expire(Keys.telemetry(job_id), self.stream_ttl_s)
        self.ownership.release(job_id)


def _gained(
    batch: Batch, gains: Gains, cursors: dict[str, set[tuple[int, int]]]
) -> tuple[int, dict[str, Any] | None]:
    """How many of the batch's points the chunks gained, and the newest of those of their
    newest attempt (the last in stream order: nearly always the very last point). Every
    point brings its cursor series (:data:`~amptrain.store.history.chunk_parts.MS`), so a
    step that series gained is a point not recorded before (a replay gains none);
    ``cursors``: :func:`_cursor_gains`."""
    c = batch.columns
    if c is None:
        rows = [p for p in batch.rows if _new(gains, p["job_id"], p["step"], p["attempt"])]
        at = _newest([p["attempt"] for p in rows])
        return len(rows), None if at is None else rows[at]
    # One set lookup a point, in C: a Python call and a dict lookup per point were ~1 us.
    got = cursors.get(c.job_id, set())
    new = list(
        compress(range(len(c)), map(got.__contains__, zip(c.steps, c.attempts, strict=True)))
    )
    at = _newest([c.attempts[i] for i in new])
    return len(new), None if at is None else c.row(new[at])


def _cursor_gains(gains: Gains) -> dict[str, set[tuple[int, int]]]:
    """Per job the (step, attempt) of every point its cursor series gained (a step names
    its chunk, so one set per job holds them all)."""
    out: dict[str, set[tuple[int, int]]] = {}
    for (job_id, kind, name, _, attempt), new in gains.items():
        if name == MS and kind == STEP_KIND:
            out.setdefault(job_id, set()).update(zip(new, repeat(attempt)))
    return out


def _new(gains: Gains, job_id: str, step: int, attempt: int) -> bool:
    got = gains.get((job_id, STEP_KIND, MS, step >> SHIFT, attempt))
    return got is not None and step in got


def _newest(attempts: list[int]) -> int | None:
    """The index of the last of the newest attempt's points (None: no point)."""
    if not attempts:
        return None
    latest = max(attempts)
    return len(attempts) - 1 - attempts[::-1].index(latest)
