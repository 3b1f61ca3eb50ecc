"""Lifecycle events of an attempt (started, requeued, finished...) and the end marker.

The supervisor reports what happened to an attempt through :class:`LifecycleEvents`;
this module decides how the event reaches SQL history and live watchers.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from sqlalchemy.orm import Session, sessionmaker

from api.contracts.stream import STREAM_MAXLEN, encode, telemetry_key
from api.store import jobs

log = logging.getLogger(__name__)


class LifecycleEvents:
    def __init__(self, sessions: sessionmaker[Session], client: redis.Redis) -> None:
        self.sessions = sessions
        self.redis = client

    def record(self, job_id: str, attempt: int, kind: str, step: int, data: dict[str, Any]) -> None:
        """Record a lifecycle event in SQL (fenced), then show it to live watchers."""
        with self.sessions.begin() as s:
            if not jobs.record_event(s, job_id, attempt, kind, step, data):
                return
        self.publish(job_id, attempt, kind, step, data)

    def publish(
        self, job_id: str, attempt: int, kind: str, step: int, data: dict[str, Any]
    ) -> None:
        item = {"kind": "event", "type": kind, "step": step, "time": time.time(), "data": data}
        self._publish(item, job_id, attempt)

    def end(self, job_id: str, attempt: int, status: str) -> None:
        """The end marker: the recorder then knows the stream is complete."""
        self._publish({"kind": "end", "status": status}, job_id, attempt)

    def _publish(self, item: dict[str, Any], job_id: str, attempt: int) -> None:
        fields = encode(item, job_id=job_id, attempt=attempt, persisted=True)
        try:
            self.redis.xadd(telemetry_key(job_id), fields, maxlen=STREAM_MAXLEN, approximate=True)  # type: ignore[arg-type]
        except redis.RedisError:
            # Live watchers miss it; SQL has it. The recorder also learns the job is over from SQL.
            log.warning(
                "job %s: could not publish %s to its stream", job_id, item.get("type", item["kind"])
            )
