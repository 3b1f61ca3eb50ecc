"""What one pool process is running, for ``GET /workers`` and the worker's /metrics.

The supervisor names the job its slot runs and, at each lease heartbeat,
copies the newest metric point of the job's telemetry stream into the slot
(throughput, loss scale, memory). Reading the stream the child already writes
costs one XREVRANGE per heartbeat and needs no change to the training child.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

import redis

from api.contracts import presence
from api.contracts.stream import decode, telemetry_key

log = logging.getLogger(__name__)

SLOT_FIELDS = (
    "step",
    "time",
    "loss",
    "loss_scale",
    "skipped_steps",
    "samples_per_second",
    "step_time_ms",
    "memory_allocated",
    "memory_reserved",
    "memory_peak",
)
_NEWEST_SCAN = 64  # entries looked at from the stream's end to find the newest metric point


class JobSlot:
    """What one pool process is running, for ``GET /workers`` and the worker's /metrics."""

    def __init__(self, client: redis.Redis, worker: str, slot: int, ttl_s: float) -> None:
        self.client = client
        self.worker = worker
        self.slot = slot
        self.ttl_s = ttl_s
        self.data: dict[str, Any] = {}

    @classmethod
    def for_this_process(cls, client: redis.Redis, worker: str, ttl_s: float) -> JobSlot:
        """The slot of the current pool process (its Celery pool index, see worker.main.signals)."""
        return cls(client, worker, int(os.environ.get("AMPTRAIN_POOL_INDEX", "0")), ttl_s)

    def start(self, job_id: str, attempt: int) -> None:
        self.data = {
            "job_id": job_id,
            "attempt": attempt,
            "gpu": os.environ.get("AMPTRAIN_ASSIGNED_GPU"),
            "pid": os.getpid(),
            "since": time.time(),
        }
        self._publish()

    def refresh(self) -> None:
        """Copy the newest metric point of this attempt into the slot; never raises."""
        if not self.data:
            return
        try:
            point = self._newest_point()
            if point is not None:
                self.data.update({f: point.get(f) for f in SLOT_FIELDS})
            self._publish()
        except (redis.RedisError, ValueError, KeyError) as exc:
            log.debug("slot refresh failed: %s", exc)

    def clear(self) -> None:
        self.data = {}
        with contextlib.suppress(redis.RedisError):  # else it expires with the lease
            presence.clear_slot(self.client, self.worker, self.slot)

    def _newest_point(self) -> dict[str, Any] | None:
        entries: Any = self.client.xrevrange(
            telemetry_key(self.data["job_id"]), "+", "-", count=_NEWEST_SCAN
        )
        for _id, fields in entries:
            item = decode(fields)
            if item["kind"] == "metric" and item["attempt"] == self.data["attempt"]:
                return item
        return None

    def _publish(self) -> None:
        try:
            presence.publish_slot(self.client, self.worker, self.slot, self.data, self.ttl_s)
        except redis.RedisError as exc:
            log.debug("slot publish failed: %s", exc)
