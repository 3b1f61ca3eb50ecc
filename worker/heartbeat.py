"""The worker's presence in Redis: who it is, its devices, and the job each slot runs.

:class:`Presence` is a daemon thread in the worker's main process: it gathers
the capability report once (in a subprocess, see :mod:`worker.devices`), logs
it, then re-publishes the worker's info with a TTL every heartbeat. It never
touches CUDA, so the pool processes forked later stay CUDA-free.

:class:`JobSlot` is the supervisor's side (in a pool process): it names the
job its slot runs and, at each lease heartbeat, copies the newest metric point
of the job's telemetry stream into the slot (throughput, loss scale, memory).
Reading the stream the child already writes costs one XREVRANGE per heartbeat
and needs no change to the training child.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any

import redis

from api import presence
from api.state.stream import decode, telemetry_key
from worker import devices

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


def redis_from_url(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)


class Presence(threading.Thread):
    """Publishes ``info`` (+ the capability report) under the worker's name until stopped."""

    def __init__(
        self,
        client: redis.Redis,
        worker: str,
        info: dict[str, Any],
        *,
        interval_s: float,
        report: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(name="amptrain-presence", daemon=True)
        self.client = client
        self.worker = worker
        self.info = dict(info)
        self.interval_s = interval_s
        self.ttl_s = presence.presence_ttl(interval_s)
        self.report = report
        self.stopped = threading.Event()

    def run(self) -> None:
        if self.report is None:
            self.report = devices.gather()
            log.info("capability report: %s", devices.summary(self.report))
        self.info.update(
            devices=self.report.get("devices", []),
            versions=self.report.get("versions", {}),
            report_error=self.report.get("error"),
        )
        failing = False
        while not self.stopped.is_set():
            try:
                presence.publish_worker(self.client, self.worker, self.info, self.ttl_s)
                if failing:
                    log.info("presence heartbeat to Redis restored")
                failing = False
            except redis.RedisError as exc:
                if not failing:
                    log.warning("presence heartbeat failed (%s); retrying", exc)
                failing = True
            self.stopped.wait(self.interval_s)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop heartbeating and leave the list at once."""
        self.stopped.set()
        self.join(timeout)
        with contextlib.suppress(redis.RedisError):  # else the TTL removes it
            presence.remove_worker(self.client, self.worker)


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
        """The slot of the current pool process (its Celery pool index, see worker.lifecycle)."""
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
