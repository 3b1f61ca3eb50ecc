"""Lifecycle events of an attempt (started, requeued, succeeded, ...) and the end marker.

They take the route engine events take (see :mod:`amptrain.contract.stream`): appended
to the job's stream through a buffered writer that keeps what Redis has not
confirmed and re-sends it after Redis lost data; the API's recorder puts them in
SQL with their entry id, so history and live watchers show them at one cursor.

The job's status is not an event: the supervisor writes it to SQL (fenced) and
publishes the event only once that write succeeded, so an attempt that lost its
lease tells no story about the job.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from amptrain.core.stream_writer import StreamWriter

DELIVER_S = 30.0
"""How long the final event and the end marker are retried while Redis is unreachable."""


class LifecycleEvents:
    """The lifecycle events of the attempt a supervisor runs (one at a time)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._writer: StreamWriter | None = None

    def publish(
        self, job_id: str, attempt: int, kind: str, step: int, data: dict[str, Any]
    ) -> None:
        """Append the event, or keep it buffered until Redis answers (retried on every call)."""
        item = {"kind": "event", "type": kind, "step": step, "time": time.time(), "data": data}
        self._for(job_id, attempt).write([item])

    def conclude(
        self,
        job_id: str,
        attempt: int,
        kind: str,
        step: int,
        data: dict[str, Any],
        *,
        end_status: str | None,
    ) -> None:
        """The attempt's last event, then (when the job is finished) the ``end`` marker that
        tells the recorder the stream is complete; delivered within :data:`DELIVER_S`."""
        self.publish(job_id, attempt, kind, step, data)
        writer = self._for(job_id, attempt)
        if end_status is not None:
            writer.write([{"kind": "end", "status": end_status}])
        writer.close(DELIVER_S)
        self._writer = None

    def _for(self, job_id: str, attempt: int) -> StreamWriter:
        w = self._writer
        if w is None or (w.job_id, w.attempt) != (job_id, attempt):
            if w is not None:
                w.close(0)  # a fenced-out attempt's leftovers: one last try, no wait
            w = self._writer = StreamWriter(self.redis, job_id, attempt)
        return w
