"""A pool process's slot: which one it is, its GPU, and the job it is running.

:class:`PoolSlot` is fixed when Celery starts the pool process
(:mod:`amptrain.worker.pool.tasks`) and handed to each supervisor it runs.
:class:`JobSlot` publishes what the slot runs, for ``GET /workers`` and the
worker's /metrics: the supervisor names the job its slot runs and, at each lease heartbeat,
copies the newest metric point of the job's telemetry stream into the slot
(throughput, loss scale, memory). Reading the stream the child already writes
costs one XREVRANGE per heartbeat and needs no change to the training child.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import redis
from billiard.process import current_process

from amptrain.contract.metrics import METRIC_FIELDS
from amptrain.contract.stream import decode
from amptrain.core import presence
from amptrain.core.redis import Keys
from amptrain.worker.main import devices

log = logging.getLogger(__name__)

SLOT_FIELDS = METRIC_FIELDS
"""What a slot shows of its job's newest point: every field of a metric record."""
_NEWEST_SCAN = 64  # entries looked at from the stream's end to find the newest metric point


@dataclass(frozen=True)
class PoolSlot:
    """Which pool process this is (Celery's pool index), the GPUs its jobs train on and how
    many devices each of its jobs takes (``amptrain worker --devices-per-job``)."""

    index: int = 0
    gpus: tuple[str, ...] = ()  # empty: the worker sees no GPU (jobs run on the CPU)
    devices_per_job: int = 1

    @property
    def gpu(self) -> str | None:
        """The slot's first GPU (its only one with one device per job); None without GPUs."""
        return self.gpus[0] if self.gpus else None

    @classmethod
    def of_this_process(cls, gpus: tuple[str, ...], devices_per_job: int = 1) -> PoolSlot:
        """Pool index i owns visible GPUs ``[i*K, (i+1)*K)`` for K devices per job (wrapping
        around when there are more pool processes than blocks of K)."""
        index = getattr(current_process(), "index", 0) or 0
        return cls(index, devices.slot_gpus(index, gpus, devices_per_job), devices_per_job)


class JobSlot:
    """What one pool process is running, for ``GET /workers`` and the worker's /metrics."""

    def __init__(self, client: redis.Redis, worker: str, pool_slot: PoolSlot, ttl_s: float) -> None:
        self.client = client
        self.worker = worker
        self.pool_slot = pool_slot
        self.ttl_s = ttl_s
        self.data: dict[str, Any] = {}

    def start(self, job_id: str, attempt: int, extra: dict[str, Any] | None = None) -> None:
        """Show the job this slot runs; ``extra``: a multi-node attempt's node and the
        state of its reservation (``waiting``, ``training``)."""
        self.data = {
            **(extra or {}),
            "job_id": job_id,
            "attempt": attempt,
            "gpu": self.pool_slot.gpu,
            "gpus": list(self.pool_slot.gpus),
            "devices_per_job": self.pool_slot.devices_per_job,
            "pid": os.getpid(),
            "since": time.time(),
        }
        self._publish()

    def note(self, **fields: Any) -> None:
        """Change what the slot shows of its job (a reservation that now trains)."""
        if self.data:
            self.data.update(fields)
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
            presence.clear_slot(self.client, self.worker, self.pool_slot.index)

    def _newest_point(self) -> dict[str, Any] | None:
        entries: Any = self.client.xrevrange(
            Keys.telemetry(self.data["job_id"]), "+", "-", count=_NEWEST_SCAN
        )
        for _id, fields in entries:
            item = decode(fields)
            if item["kind"] == "metric" and item["attempt"] == self.data["attempt"]:
                return item
        return None

    def _publish(self) -> None:
        try:
            presence.publish_slot(
                self.client, self.worker, self.pool_slot.index, self.data, self.ttl_s
            )
        except redis.RedisError as exc:
            log.debug("slot publish failed: %s", exc)
